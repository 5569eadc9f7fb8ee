"""Optimizer groups, the warmup + cosine schedule at hand-computed steps, and gradient clipping."""

import math

import pytest
import torch

from planc.runtime.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_, lr_at
from planc.runtime.transformer import build_model, init_weights, loss_fn
from planc.spec import ModelSpec, TrainSpec

SPEC = ModelSpec(layers=2, hidden=32, heads=4, vocab=64, seq_len=8)


def test_weight_decay_only_on_matrices_and_embeddings():
    model = build_model(SPEC)
    opt = build_optimizer(model.parameters(), TrainSpec(global_batch=2, weight_decay=0.1))
    assert isinstance(opt, torch.optim.AdamW)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    plain = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.ndim >= 2), name
        assert (id(p) in decayed) != (id(p) in plain), name


def test_optimizer_kinds_and_hyperparameters():
    params = list(build_model(SPEC).parameters())
    adam = build_optimizer(params, TrainSpec(global_batch=2, optimizer="adam", beta1=0.8, beta2=0.9, lr=1e-3))
    assert type(adam) is torch.optim.Adam and adam.param_groups[0]["betas"] == (0.8, 0.9)
    sgd = build_optimizer(params, TrainSpec(global_batch=2, optimizer="sgd"))
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["momentum"] == 0.9


def test_lr_schedule_at_hand_computed_steps():
    train = TrainSpec(global_batch=2, lr=1e-3, min_lr=1e-4, warmup_steps=4, steps=14)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model.parameters(), train)
    sched = build_lr_scheduler(opt, train)
    seen = []
    for _ in range(16):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    expected = {
        0: 1e-3 * 1 / 4,  # warmup: lr * (step + 1) / warmup
        1: 1e-3 * 2 / 4,
        3: 1e-3,  # last warmup step reaches lr
        4: 1e-3,  # cosine at t = 0
        9: 1e-4 + 0.9e-3 * 0.5,  # t = (9 - 4) / (14 - 4) = 0.5: cos = 0 -> midpoint 5.5e-4
        14: 1e-4,  # t = 1: min_lr
        15: 1e-4,  # past the end: stays at min_lr
    }
    for step, lr in expected.items():
        assert seen[step] == pytest.approx(lr, rel=1e-12), step
        assert lr_at(step, train) == pytest.approx(lr, rel=1e-12)
    # t = 0.25 (step 6.5 is not an integer; step 7 is t = 0.3): min + span * (1 + cos(0.3 pi)) / 2
    assert seen[7] == pytest.approx(1e-4 + 0.9e-3 * (1 + math.cos(0.3 * math.pi)) / 2)


def test_no_warmup_starts_at_full_lr():
    train = TrainSpec(global_batch=2, lr=0.5, warmup_steps=0, steps=10)
    assert lr_at(0, train) == 0.5 and lr_at(5, train) == pytest.approx(0.25)


def _model_with_grads(seed=0):
    model = build_model(SPEC)
    init_weights(model, seed)
    tokens = torch.randint(0, SPEC.vocab, (4, SPEC.seq_len + 1), generator=torch.Generator().manual_seed(seed))
    loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    return model


@pytest.mark.parametrize("max_norm", [1e-3, 1e6])
def test_clip_grad_norm_equals_torch(max_norm):
    ours = _model_with_grads()
    theirs = _model_with_grads()  # same seed and tokens: identical gradients
    norm = clip_grad_norm_(ours.parameters(), max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    torch.testing.assert_close(norm, expected)
    # The norm is summed in another order than torch's (squares of the tensors' norms in float32, not
    # the norm of their norms), so the rescale may differ in the last bit.
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_clip_with_zero_max_norm_only_measures():
    model = _model_with_grads()
    before = [p.grad.clone() for p in model.parameters()]
    norm = clip_grad_norm_(model.parameters(), 0.0)
    manual = torch.sqrt(sum((g.double() ** 2).sum() for g in before))
    assert norm.item() == pytest.approx(manual.item(), rel=1e-5)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before))


def test_a_rank_without_gradients_makes_its_zero_norm_on_its_own_device():
    """A pipeline rank with no gradient still all-reduces its norm with the other stages; under NCCL
    that tensor must be on the rank's GPU, not the CPU (found by reading, never run on NCCL). The
    meta device stands in for the GPU: the zero is made where the caller says."""
    from planc.runtime.grad_norm import grad_norm

    assert grad_norm([], device="meta").device.type == "meta"
    assert grad_norm([]).device.type == "cpu"


def test_the_norm_takes_gradients_of_several_dtypes_and_the_inf_norm():
    """A bf16 and an fp32 gradient in one norm (foreach norms come back in each tensor's dtype), and
    the max norm, against the norms worked out by hand."""
    from types import SimpleNamespace

    from planc.runtime.grad_norm import grad_norm

    a = torch.tensor([3.0, -4.0], dtype=torch.bfloat16)
    b = torch.tensor([[12.0], [-13.5]])
    holders = [SimpleNamespace(grad=a), SimpleNamespace(grad=b), SimpleNamespace(grad=None)]
    assert grad_norm(holders).item() == pytest.approx((9 + 16 + 144 + 13.5**2) ** 0.5)
    assert grad_norm(holders, float("inf")).item() == 13.5
