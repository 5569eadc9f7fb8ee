"""Activation recomputation: what each mode recomputes in backward, counted op by op (one process).

A TorchDispatchMode counts the aten ops that run during ``backward()``: full recomputation
re-runs the block's matmuls, selective recomputation does not (their outputs are saved) but
re-runs the cheap element-wise ops; without recomputation neither is re-run. Gradients are the
same in all three modes.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planc.runtime.transformer import TransformerBlock, init_weights
from planc.spec import build_plan
from planc.strategies.recompute.runtime import wrap_block

MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def spec():
    return build_plan(
        {
            "model": {"layers": 1, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 8},
            "hardware": {"device": "cpu", "per_node": 1},
            "train": {"global_batch": 2},
        }
    ).model


def backward_ops(spec, mode):
    torch.manual_seed(0)
    block = TransformerBlock(spec)
    wrapper = torch.nn.Module()
    wrapper.layers = torch.nn.ModuleDict({"0": block})
    init_weights(wrapper, 0, spec)
    if mode != "none":
        block = wrap_block(copy.deepcopy(block), mode)
    x = torch.randn(2, spec.seq_len, spec.hidden, requires_grad=True, generator=torch.Generator().manual_seed(1))
    loss = block(x).square().mean()
    with CountOps() as counter:
        loss.backward()
    grads = [p.grad.clone() for p in block.parameters()]
    return counter.counts, grads, x.grad.clone()


def matmuls(counts):
    return sum(counts[name] for name in MATMULS)


def test_full_recomputes_every_matmul_selective_only_the_attention_out(spec):
    none, g_none, x_none = backward_ops(spec, "none")
    full, g_full, x_full = backward_ops(spec, "full")
    selective, g_sel, x_sel = backward_ops(spec, "selective")
    sdpa = "_scaled_dot_product_flash_attention_for_cpu"
    # Full: backward's own matmuls plus the forward's linears and attention again.
    assert matmuls(full) > matmuls(none) and full[sdpa] == 1 and none[sdpa] == 0
    # Selective: the matmul and attention outputs were saved, so none of them runs again except
    # the attention-out projection, whose output is not kept (the MLP-down one is never needed:
    # recomputation stops once its input is rebuilt)...
    assert matmuls(selective) == matmuls(none) + 1 and selective[sdpa] == 0
    # ...but the element-wise ops between them do (the norm and the GELU run again).
    recomputed = {"native_layer_norm", "gelu"}
    assert sum(selective[n] for n in recomputed) > sum(none[n] for n in recomputed)
    for a, b, c in zip(g_none, g_full, g_sel):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)
    torch.testing.assert_close(x_none, x_sel)
    torch.testing.assert_close(x_none, x_full)


def test_unknown_mode_is_an_error(spec):
    with pytest.raises(ValueError, match="unknown recompute mode"):
        wrap_block(TransformerBlock(spec), "half")
