"""The simulation's RMSNorm keeps for backward what torch's CUDA kernel keeps (issue 13).

On CUDA ``torch.rms_norm`` runs ``aten._fused_rms_norm``, whose autograd saves the input and one
float32 ``rstd`` per row; on CPU (where the simulation's fake tensors live) it decomposes and keeps
two float32 copies of a bf16 input. :func:`cuda_rms_norm` must save exactly input + rstd and give
the same values and gradients as ``F.rms_norm``.
"""

import torch
import torch.nn.functional as F

from planc.verify.cuda_kernels import cuda_rms_norm


def saved_bytes(fn) -> int:
    """Bytes of every distinct storage autograd saves while ``fn`` runs."""
    storages: dict[int, int] = {}

    def pack(t):
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_a_bf16_norm_keeps_its_input_and_rstd_only():
    rows, hidden = 6, 64
    x = torch.randn(2, rows // 2, hidden, dtype=torch.bfloat16, requires_grad=True)
    norm = torch.nn.RMSNorm(hidden, eps=1e-5, dtype=torch.bfloat16)
    with cuda_rms_norm([norm]):
        kept = saved_bytes(lambda: norm(x))
    # input 6 x 64 x 2 bytes + weight 64 x 2 + rstd 6 x 4 = 768 + 128 + 24
    assert kept == 768 + 128 + 24
    # outside, torch's CPU decomposition keeps float32 copies of the input (>= 2 x 6 x 64 x 4 bytes)
    assert saved_bytes(lambda: norm(x)) >= 2 * rows * hidden * 4


def test_values_and_gradients_are_torch_s():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(16, dtype=torch.float64, requires_grad=True)
    expected = F.rms_norm(x, (16,), weight, 1e-6)
    expected_grads = torch.autograd.grad(expected.square().sum(), (x, weight))
    norm = torch.nn.RMSNorm(16, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(weight)
    with cuda_rms_norm([torch.nn.Sequential(norm)]):
        got = norm(x)
        grads = torch.autograd.grad(got.square().sum(), (x, norm.weight))
    torch.testing.assert_close(got, expected)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e)


def test_checkpoint_recomputation_saves_the_same():
    """Activation checkpointing reruns the forward in backward (outside any mode entered around the
    step) and checks it saves tensors of the same metadata: the norm must take the same path."""
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(2, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    norm = torch.nn.RMSNorm(8, dtype=torch.bfloat16)
    with cuda_rms_norm([norm]):
        checkpoint(norm, x, use_reentrant=False).float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
