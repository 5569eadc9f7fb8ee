"""The tensor-parallel plan of planc's transformer (run time; imports torch).

Module names are those of :mod:`planc.runtime.transformer` (torchtitan's). The plan follows the pattern
of torchtitan's ``apply_tp`` and PyTorch's TP tutorial; what is planc's own is that every
remaining parameter becomes a replicated DTensor (:class:`ReplicateParallel`) and that a learned
position embedding is sliced to the local sequence shard under sequence parallelism.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from planc.runtime.transformer import Transformer, TransformerBlock

#: Activations are [batch, seq, hidden]; sequence parallelism shards dim 1.
SEQUENCE_DIM = 1


class ReplicateParallel(ParallelStyle):
    """Replicate a module's parameters as DTensors; its input becomes a replicated DTensor and its
    output is returned as a local tensor laid out as ``output_layout`` (``Shard(1)``: this rank's
    slice of the sequence, which costs no communication).

    For modules that tensor parallelism does not split (norms without sequence parallelism, a
    learned position embedding): their gradients come out as replicated DTensors, and every
    parameter of the model is a DTensor on the "tp" mesh, as FSDP2's 2-D sharding and the
    gradient-norm computation want.
    """

    def __init__(self, output_layout=None):
        super().__init__()
        self.output_layout = Replicate() if output_layout is None else output_layout

    @staticmethod
    def _replicate_params(name, module, mesh):
        for param_name, param in list(module.named_parameters(recurse=False)):
            replicated = DTensor.from_local(param, mesh, [Replicate()], run_check=False)
            module.register_parameter(param_name, nn.Parameter(replicated, requires_grad=param.requires_grad))

    @staticmethod
    def _input_fn(module, inputs, mesh):
        return tuple(
            DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )

    @staticmethod
    def _output_fn(layout, module, output, mesh):
        if output.placements != (layout,):
            output = output.redistribute(placements=[layout])
        return output.to_local()

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        return distribute_module(
            module, device_mesh, self._replicate_params, self._input_fn, partial(self._output_fn, self.output_layout)
        )


def block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of one transformer block (names relative to the block)."""
    # Between sub-layers the residual stream is sequence-sharded (SP) or replicated (plain TP).
    stream = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    norm = SequenceParallel() if sequence_parallel else ReplicateParallel()
    return {
        "attention_norm": norm,
        # Attention takes (x, rope): gather x to the full sequence; rope is a plain table (None layout).
        "attention": PrepareModuleInput(input_layouts=(stream, None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=stream),
        "ffn_norm": norm,
        "feed_forward": PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=stream),
        "feed_forward.w3": ColwiseParallel(),
    }


def parallelize(model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Apply tensor (and sequence) parallelism to one model part in place; absent parts are skipped."""
    stream = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    root: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        # Vocabulary-parallel embedding: each rank looks up its vocabulary slice (zeros elsewhere),
        # then the partial sums are all-reduced (or reduce-scattered along the sequence).
        root["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    if model.pos_embeddings is not None:
        root["pos_embeddings"] = ReplicateParallel(output_layout=stream)
    if model.norm is not None:
        root["norm"] = SequenceParallel() if sequence_parallel else ReplicateParallel()
    if model.output is not None:
        root["output"] = ColwiseParallel(
            input_layouts=stream,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if root:
        parallelize_module(model, tp_mesh, root)
    for block in model.layers.values():
        plan = block_plan(sequence_parallel)
        if isinstance(block, TransformerBlock) and block.feed_forward.w3 is None:  # GELU MLP: no gate matrix
            del plan["feed_forward.w3"]
        parallelize_module(block, tp_mesh, plan)
    if model.spec.tie_embeddings and model.tok_embeddings is not None and model.output is not None:
        # parallelize_module gave each module its own DTensor; both are Shard(0) of the same
        # [vocab, hidden] matrix, so the output can use the embedding's again.
        model.output.weight = model.tok_embeddings.weight
    if sequence_parallel and model.tok_embeddings is None:
        # A later pipeline stage receives hidden states already split along the sequence.
        model.sequence_shards = tp_mesh.size()
