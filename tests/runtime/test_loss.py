"""The chunked float32 loss: the same numbers as one cross-entropy, a fraction of its memory.

The reference is ``torch.nn.functional.cross_entropy`` on the whole float32 logits (restricted to
the real vocabulary); memory is measured by bench/loss_memory.py's ``PeakBytes`` and compared to
the cost model's :func:`planc.cost.memory.logits_bytes`.
"""

import pytest
import torch
import torch.nn.functional as F
from bench_scripts import load_bench
from ranks import run_ranks

from planc.cost.memory import LOSS_CHUNK_ELEMENTS
from planc.runtime.loss import CHUNK_ELEMENTS, chunked_cross_entropy, tokens_per_chunk


def _case(b=3, s=10, padded=96, vocab=90, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, s, padded, generator=generator) * 3
    targets = torch.randint(0, vocab, (b, s), generator=generator)
    return logits, targets


def _reference(logits, targets, vocab):
    x = logits.detach().float().requires_grad_()
    loss = F.cross_entropy(x[..., :vocab].flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("backward", ["in_forward", "recompute"])
@pytest.mark.parametrize("chunk_elements", [96, 7 * 96, 10_000, 2**26])  # 1 token, ragged, 2 chunks, one chunk
def test_equals_one_float32_cross_entropy_over_the_real_vocabulary(chunk_elements, backward):
    logits, targets = _case()
    expected, expected_grad = _reference(logits, targets, vocab=90)
    x = logits.clone().requires_grad_()
    loss = chunked_cross_entropy(x, targets, vocab=90, chunk_elements=chunk_elements, backward=backward)
    loss.backward()
    assert abs(loss.item() - expected.item()) < 1e-6
    assert (x.grad - expected_grad).abs().max() < 1e-7
    assert torch.count_nonzero(x.grad[..., 90:]) == 0  # the padding never receives a gradient


@pytest.mark.parametrize("backward", ["in_forward", "recompute"])
def test_bf16_logits_are_upcast_per_chunk(backward):
    logits, targets = _case()
    half = logits.bfloat16()
    expected, expected_grad = _reference(half, targets, vocab=90)  # the float32 loss of the bf16 values
    x = half.clone().requires_grad_()
    loss = chunked_cross_entropy(x, targets, vocab=90, chunk_elements=5 * 96, backward=backward)
    loss.backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - expected.item()) < 1e-6
    assert x.grad.dtype == torch.bfloat16
    assert (x.grad.float() - expected_grad).abs().max() < 2e-3  # the gradient rounded to bf16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_overwritten_logits_hold_their_gradient_and_the_numbers_are_unchanged(dtype):
    """planc's step writes the gradient over the logits (``overwrite_logits``): the same loss and
    gradient as kept beside them, in the logits' own storage; a leaf the caller made is not touched."""
    logits, targets = _case()
    logits = logits.to(dtype)
    bias = torch.zeros(96, dtype=dtype, requires_grad=True)
    beside = (logits + bias).detach().requires_grad_()  # a leaf: its gradient lands in .grad
    expected = chunked_cross_entropy(beside, targets, vocab=90, chunk_elements=7 * 96)
    expected.backward()

    produced = logits + bias  # not a leaf, as the head's output is
    gradients = []
    produced.register_hook(gradients.append)
    storage = produced.untyped_storage().data_ptr()
    loss = chunked_cross_entropy(produced, targets, vocab=90, chunk_elements=7 * 96, overwrite_logits=True)
    loss.backward()
    assert loss.item() == expected.item()
    assert torch.equal(gradients[0], beside.grad)
    assert gradients[0].untyped_storage().data_ptr() == storage  # the logits' storage holds it

    leaf = logits.clone().requires_grad_()
    before = leaf.detach().clone()
    chunked_cross_entropy(leaf, targets, vocab=90, chunk_elements=7 * 96, overwrite_logits=True).backward()
    assert torch.equal(leaf.detach(), before)


def test_an_op_that_saved_the_logits_makes_the_overwrite_fail_loudly():
    """Overwriting logits that autograd saved would corrupt that node's backward: the shared version
    counter makes it raise instead (planc's head saves its input and weight, never its output)."""
    logits, targets = _case()
    x = logits.clone().requires_grad_()
    saved_by_exp = x.exp()  # exp's backward reads its output
    loss = chunked_cross_entropy(saved_by_exp, targets, vocab=90, chunk_elements=7 * 96, overwrite_logits=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_gradient_scales_with_the_incoming_gradient():
    """What backward receives (a loss scaled for accumulation) multiplies the gradient kept from
    the forward; that gradient is scaled in place, so a second backward says it is not supported."""
    logits, targets = _case()
    _, expected_grad = _reference(logits, targets, vocab=90)
    x = logits.clone().requires_grad_()
    loss = chunked_cross_entropy(x, targets, vocab=90, chunk_elements=7 * 96)
    (0.25 * loss).backward(retain_graph=True)
    assert (x.grad - 0.25 * expected_grad).abs().max() < 1e-8
    with pytest.raises(RuntimeError, match="run backward through it once"):
        (3.0 * loss).backward()


def test_without_gradients_nothing_is_kept():
    """Validation runs under no_grad: the chunks are summed, no gradient is computed or kept."""
    logits, targets = _case()
    expected, _ = _reference(logits, targets, vocab=90)
    x = logits.clone().requires_grad_()
    with torch.no_grad():
        loss = chunked_cross_entropy(x, targets, vocab=90, chunk_elements=7 * 96)
    assert loss.grad_fn is None and abs(loss.item() - expected.item()) < 1e-6


def test_without_vocab_every_column_counts():
    logits, targets = _case(padded=90)
    expected, _ = _reference(logits, targets, vocab=90)
    assert abs(chunked_cross_entropy(logits, targets, chunk_elements=200).item() - expected.item()) < 1e-6


def test_chunks_hold_at_most_the_budget():
    assert CHUNK_ELEMENTS == LOSS_CHUNK_ELEMENTS  # the runtime runs what the cost model assumes
    # 2**26 = 67,108,864 logits: 1,334 tokens of GPT-2's padded 50,304, 10,672 of its 6,288 under TP 8
    assert tokens_per_chunk(50304) == 1334 and tokens_per_chunk(50304 // 8) == 10672
    assert tokens_per_chunk(2**27) == 1


def test_peak_memory_is_measured_and_predicted():
    """Measured peaks (bench/loss_memory.py): the chunked loss, either way, within 1% of
    logits_bytes, and at most 0.45 of the whole-tensor float32 loss in bf16 (0.75 in fp32) once
    there are several chunks."""
    bench = load_bench("loss_memory")
    for b, s, vocab, padded, chunk in bench.CASES:
        for name, dtype in bench.DTYPES.items():
            n = b * s * padded
            old = bench.measure("old", b, s, vocab, padded, dtype, chunk)
            assert old == pytest.approx(12 * n, rel=0.01), (b, s, name)  # fp32 log-softmax out + 2 gradients
            for kind in bench.KINDS:
                new = bench.measure(kind, b, s, vocab, padded, dtype, chunk)
                predicted = bench.predicted(b, s, vocab, padded, dtype, chunk, kind)
                assert new == pytest.approx(predicted, rel=0.01), (b, s, name, kind)
                if n > 4 * chunk:
                    assert new < (0.45 if dtype == torch.bfloat16 else 0.75) * old, (b, s, name, kind, new, old)


def check_loss_parallel(payload: None) -> None:
    """On each of the 2 ranks (tests/ranks.py)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    logits, targets = _case(b=2, s=12, padded=96, vocab=90, seed=3)
    expected, expected_grad = _reference(logits, targets, vocab=90)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for backward in ("in_forward", "recompute"):
        sharded = distribute_tensor(logits.clone(), mesh, [Shard(2)]).requires_grad_()
        with loss_parallel():  # as planc's step: forward and backward inside
            # 5 tokens per chunk
            loss = chunked_cross_entropy(sharded, targets, vocab=90, chunk_elements=5 * 48, backward=backward)
            loss.backward()
        assert abs(loss.full_tensor().item() - expected.item()) < 1e-6, backward
        assert (sharded.grad.full_tensor() - expected_grad).abs().max() < 1e-7, backward
        assert sharded.grad.to_local().shape == (2, 12, 48)  # the gradient stayed vocabulary-sharded


@pytest.mark.dist
def test_vocabulary_sharded_logits_under_loss_parallel():
    """The padding (columns 90..95) lies in rank 1's shard; chunks of 5 tokens, the last ragged."""
    run_ranks("tests/runtime/test_loss.py:check_loss_parallel", 2)


def check_pipelined_loss(payload: None) -> None:
    """On each of the 2 ranks: a 4-layer model in torch.distributed.pipelining, the loss in 5-token
    chunks either way, under GPipe, 1F1B and interleaved 1F1B; gradients against one process's."""
    import copy

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(8, 12, 16, generator=generator)
    targets = torch.randint(0, 90, (8, 12), generator=generator)
    torch.manual_seed(0)
    layers = [
        nn.Linear(16, 16),
        nn.Linear(16, 16),
        nn.Linear(16, 16),
        nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 96)),
    ]
    full = nn.Sequential(*layers)
    # the reference: the mean over 4 micro-batches of each one's float32 cross-entropy
    losses = [
        F.cross_entropy(full(x)[..., :90].flatten(0, 1), y.flatten()) for x, y in zip(inputs.chunk(4), targets.chunk(4))
    ]
    (sum(losses) / 4).backward()
    expected = [[p.grad.clone() for p in layer.parameters()] for layer in layers]
    cases = [("gpipe", "recompute"), ("1f1b", "in_forward"), ("interleaved", "in_forward"), ("1f1b", "recompute")]
    for schedule_name, backward in cases:
        interleaved = schedule_name == "interleaved"
        owned = [rank, rank + world] if interleaved else [rank]  # stage indices on this rank
        groups = [[k] for k in range(4)] if interleaved else [[0, 1], [2, 3]]
        parts = [(s, nn.Sequential(*[copy.deepcopy(layers[k]) for k in groups[s]])) for s in owned]
        for _, part in parts:
            part.zero_grad(set_to_none=True)
        events: list[tuple[str, int]] = []

        def loss_fn(output, target, events=events, backward=backward):
            index = sum(1 for kind, _ in events if kind == "forward")
            loss = chunked_cross_entropy(output, target, vocab=90, chunk_elements=5 * 96, backward=backward)
            loss.register_hook(lambda grad, index=index: events.append(("backward", index)))
            events.append(("forward", index))
            return loss

        num_stages = 4 if interleaved else world
        stages = [PipelineStage(part, s, num_stages, torch.device("cpu")) for s, part in parts]
        if interleaved:
            schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=loss_fn, scale_grads=True)
        else:
            kind = ScheduleGPipe if schedule_name == "gpipe" else Schedule1F1B
            schedule = kind(stages[0], n_microbatches=4, loss_fn=loss_fn, scale_grads=True)
        args = (inputs,) if rank == 0 else ()
        kwargs = {"target": targets} if rank == world - 1 else {}
        schedule.step(*args, **kwargs)
        for stage, part in parts:
            layer_indices = groups[stage]
            want = [g for k in layer_indices for g in expected[k]]
            for got, wanted in zip((p.grad for p in part.parameters()), want):
                assert (got - wanted).abs().max() < 1e-6, (schedule_name, backward, stage)
        if rank == world - 1:
            in_flight = peak = 0
            for kind, _ in events:
                in_flight += 1 if kind == "forward" else -1
                peak = max(peak, in_flight)
            # 4 micro-batches (torch 2.13 also runs the loss once, forward and backward, on the
            # first step to infer the stages' gradient shapes)
            assert sum(kind == "forward" for kind, _ in events) >= 4, events
            # what planc.cost.memory.loss_kind relies on: 1F1B and interleaved 1F1B hold one
            # micro-batch's loss at a time on the last stage, GPipe all of them
            assert peak == (4 if schedule_name == "gpipe" else 1), (schedule_name, events)


@pytest.mark.dist
def test_pipelined_losses_either_way_and_how_many_the_last_stage_holds():
    run_ranks("tests/runtime/test_loss.py:check_pipelined_loss", 2)
