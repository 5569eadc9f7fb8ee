"""The chunked float32 loss: the same numbers as one cross-entropy, a fraction of its memory.

The reference is ``torch.nn.functional.cross_entropy`` on the whole float32 logits (restricted to
the real vocabulary); memory is measured by bench/loss_memory.py's ``PeakBytes`` and compared to
the cost model's :func:`planc.cost.memory.logits_bytes`.
"""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ranks import run_ranks

from planc.cost.memory import LOSS_CHUNK_ELEMENTS
from planc.runtime.loss import CHUNK_ELEMENTS, chunked_cross_entropy, tokens_per_chunk

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("loss_memory", ROOT / "bench" / "loss_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    bench = _bench()
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
