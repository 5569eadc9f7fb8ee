"""What verify counts as saved activations: autocast's bf16 weight copies are weights, not activations.

Found on the first GPU run (docs/gpu.md): a linear under autocast saves its bf16 weight *transposed*,
a view of the copy, which the count took for an activation -- per block exactly the block's
parameters x 2 bytes above the prediction (436 MB of 2.15 GB at Llama 3 8B's width).
"""

from __future__ import annotations

import torch
from torch import nn

from planc.verify.saved_activations import SavedActivations


class OneBlockModel(nn.Module):
    """The shape SavedActivations expects: a ``layers`` dict of blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({"0": nn.Linear(64, 32, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers["0"](x)


def test_autocast_weight_copies_and_their_views_are_not_counted():
    torch.manual_seed(0)
    model = OneBlockModel()
    x = torch.randn(16, 64, requires_grad=True)
    counter = SavedActivations()
    with counter.step([model]), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x * 1.0).sum().backward()
    # Only the input's bf16 copy is saved for the weight's gradient: 16 x 64 x 2 bytes. The weight's
    # bf16 copy (32 x 64 x 2 = 4096 bytes), saved transposed for the input's gradient, is a weight.
    assert counter.summary()["per_block_bytes"] == 16 * 64 * 2


def test_a_functional_collective_in_flight_is_weighed_by_its_buffer():
    """Sequence parallelism leaves DTensors whose local tensor is an ``AsyncCollectiveTensor``, which
    has no storage to ask (verify of a TP + SP plan in bf16 crashed on it, found by bench/gpu_layouts.py):
    its buffer, ``elem``, is what is weighed."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    from planc.verify.saved_activations import _local

    buffer = torch.randn(4)
    in_flight = AsyncCollectiveTensor(buffer)  # .untyped_storage().data_ptr() raises on it
    assert _local(in_flight) is buffer
