"""The plan ``planc verify`` can run here, and what it had to change to get there.

On the plan's own hardware (``device = "cpu"``, or a single node whose GPUs this machine has)
the plan runs as written. Otherwise verify runs a stand-in on CPU processes over gloo and says
what it changed, each change the smallest that makes the run possible:

- the device becomes ``cpu`` with the layout's world size on one node;
- the layout is fixed to the one the planner chose for the real plan (tp, pp, dp, ZeRO,
  recomputation, schedule, virtual stages, sequence parallelism, micro-batch);
- data parallelism shrinks when tp x pp x dp exceeds :data:`MAX_CPU_PROCESSES` (the other
  degrees stay; a layout whose tp x pp alone exceeds it cannot stand in: use ``--simulate``);
  down to one rank, ZeRO goes with it (there is nothing to shard over);
- a model too large for a CPU step (over :data:`MAX_CPU_PARAMS` parameters, or longer sequences
  than :data:`MAX_CPU_SEQ`) keeps its kind -- GQA ratio, MLP and norm kind, tied embeddings --
  with one or two layers per pipeline chunk, at the width of :data:`CPU_HEAD_DIM`-wide heads, with
  a shorter sequence and vocabulary; and the batch keeps at most :data:`MAX_CPU_ACCUMULATION` micro-batches per rank.

The prediction ``verify`` compares against is always the cost model's for the plan that ran,
so the comparison checks the model's formulas, not the shrinking.
"""

from __future__ import annotations

from dataclasses import dataclass

from planc.spec import Layout, ModelSpec, Plan

MAX_CPU_PROCESSES = 8
MAX_CPU_PARAMS = 50_000_000
MAX_CPU_SEQ = 256
MAX_CPU_ACCUMULATION = 4
CPU_HEAD_DIM = 16
CPU_VOCAB = 512


@dataclass(frozen=True)
class StandIn:
    plan: Plan
    changes: tuple[str, ...]
    """What differs from the plan as written (empty: it runs as written)."""


class CannotStandIn(ValueError):
    """The layout needs more processes than a CPU stand-in runs."""


def runs_here(plan: Plan, cuda_devices: int) -> bool:
    hw = plan.hardware
    return hw.is_cpu or (hw.nodes == 1 and cuda_devices >= hw.per_node)


def stand_in(plan: Plan, layout: Layout, cuda_devices: int) -> StandIn:
    """``plan`` when it runs here as written, else the CPU stand-in described in the module docstring."""
    if runs_here(plan, cuda_devices):
        return StandIn(plan, ())
    data = plan.model_dump(mode="json", exclude_computed_fields=True)
    changes = [
        f"device {plan.hardware.device} x {plan.world_size} -> CPU processes (this machine has "
        f"{cuda_devices} CUDA device(s))"
    ]
    dp = layout.dp
    if layout.tp * layout.pp * dp > MAX_CPU_PROCESSES:
        if layout.tp * layout.pp > MAX_CPU_PROCESSES:
            raise CannotStandIn(
                f"the layout's tp x pp = {layout.tp} x {layout.pp} needs more than {MAX_CPU_PROCESSES} CPU processes"
            )
        dp = max(1, MAX_CPU_PROCESSES // (layout.tp * layout.pp))
        changes.append(f"data parallelism {layout.dp} -> {dp} (at most {MAX_CPU_PROCESSES} processes)")
    zero = layout.zero
    if dp == 1 and zero:
        # ZeRO over one data-parallel rank shards nothing, and no plan may ask for it (legality:
        # "zero needs dp > 1"); run as written, FSDP over one rank, it held what the model prices
        # for no sharding at all (a TP 8 x ZeRO-3 stand-in read its peak 7 % low)
        zero = 0
        changes.append(f"ZeRO-{layout.zero} -> none (one data-parallel rank has nothing to shard over)")
    world = layout.tp * layout.pp * dp
    data["hardware"] = {"device": "cpu", "nodes": 1, "per_node": world}
    accumulation = min(layout.grad_accumulation(plan.train.global_batch), MAX_CPU_ACCUMULATION)
    if layout.pp > 1:
        accumulation = max(accumulation, layout.pp)  # keep the pipeline full
    micro_batch = min(layout.micro_batch, 2)
    global_batch = dp * micro_batch * accumulation
    if global_batch != plan.train.global_batch:
        changes.append(
            f"global batch {plan.train.global_batch} -> {global_batch} "
            f"({accumulation} micro-batch(es) of {micro_batch} per rank)"
        )
    data["train"].update(global_batch=global_batch, micro_batch=micro_batch, data="synthetic", val_data=None, log=[])
    model = plan.model
    if model.params > MAX_CPU_PARAMS or model.seq_len > MAX_CPU_SEQ:
        data["model"] = _small_model(plan, layout)
        changes.append(f"model {model.params / 1e6:,.0f} M parameters -> {_describe(data['model'], model)}")
    data["layout"] = {
        "tp": layout.tp,
        "pp": layout.pp,
        "dp": dp,
        "zero": zero,
        "recompute": layout.recompute,
        "schedule": layout.schedule or "auto",
        "virtual_stages": layout.virtual_stages,
        "sequence_parallel": layout.sequence_parallel,
    }
    data["checkpoint"] = None
    return StandIn(Plan.model_validate(data), tuple(changes))


def _small_model(plan: Plan, layout: Layout) -> dict:
    m = plan.model
    group = max(1, m.heads // m.kv_heads)  # query heads per kv head (GQA)
    kv_heads = max(layout.tp, 2)
    heads = kv_heads * group
    hidden = heads * CPU_HEAD_DIM
    chunks = layout.pp * layout.virtual_stages
    layers = chunks * max(1, min(2, m.layers // chunks))
    ffn_ratio = m.ffn / m.hidden
    ffn = int(round(hidden * ffn_ratio / (8 * layout.tp))) * 8 * layout.tp
    return {
        "name": f"{m.name or 'model'} (CPU stand-in)",
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn": ffn,
        "vocab": CPU_VOCAB,
        "seq_len": min(m.seq_len, 128),
        "mlp": m.mlp,
        "norm": m.norm,
        "position": m.position,
        "tie_embeddings": m.tie_embeddings,
        "bias": m.bias,
        "qkv_bias": m.qkv_bias,
        "init": "random",
    }


def _describe(small: dict, model: ModelSpec) -> str:
    """What the stand-in is and what it keeps of ``model``, from the stand-in itself: fewer layers
    (as many per pipeline chunk as it can, up to 2), narrower, a small vocabulary and sequence; the
    same block (MLP, norm, positions, tying, biases), query heads per kv head and ffn / hidden."""
    kept = [f"{small['mlp']} / {small['norm']} / {small['position']}"]
    if small["tie_embeddings"]:
        kept.append("tied embeddings")
    kept += [
        f"{small['heads'] // small['kv_heads']} query head(s) per kv head",
        f"ffn / hidden {small['ffn'] / small['hidden']:.3g} (of {model.ffn / model.hidden:.3g})",
    ]
    return (
        f"{small['layers']} of {model.layers} layers, hidden {small['hidden']} (of {model.hidden}), "
        f"{small['heads']} heads ({small['kv_heads']} kv), ffn {small['ffn']}, vocab {small['vocab']} "
        f"(of {model.vocab}), sequence {small['seq_len']} (of {model.seq_len}); kept: {', '.join(kept)}"
    )
