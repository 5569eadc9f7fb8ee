"""init_weights on DTensor shards equals the slice of the single-process init (2 gloo processes).

One launch checks both sharders PyTorch offers: DTensor tensor parallelism (``parallelize_module``
with column/row-wise plans, so the attention must find its local heads) and FSDP2 ``fully_shard``
(dim-0 shards, including an uneven one: 15 position rows over 2 ranks), and that each rank
draws only the initial values of its own shard.
"""

import pytest
import torch
from ranks import run_ranks

SPEC = dict(
    layers=2, hidden=64, heads=4, kv_heads=2, vocab=300, seq_len=15, mlp="swiglu", norm="rmsnorm", position="learned"
)


def check_tp_and_fsdp(payload: None) -> None:
    """On each of the 2 ranks (tests/ranks.py)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from planc.runtime.transformer import build_model, init_weights
    from planc.spec import ModelSpec

    spec = ModelSpec(**SPEC)
    full = build_model(spec)
    init_weights(full, seed=7)
    reference = dict(full.named_parameters())
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))

    # Tensor parallel (Megatron-style plan, addressed by the model's module names).
    tp = build_model(spec, device="meta")
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=torch.distributed.tensor.Replicate()),
        "output": ColwiseParallel(output_layouts=torch.distributed.tensor.Replicate()),
    }
    for i in tp.layers:
        plan |= {f"layers.{i}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}
        plan |= {f"layers.{i}.feed_forward.{w}": ColwiseParallel() for w in ("w1", "w3")}
        plan |= {f"layers.{i}.attention.wo": RowwiseParallel(), f"layers.{i}.feed_forward.w2": RowwiseParallel()}
    parallelize_module(tp, mesh, plan)
    tp.to_empty(device="cpu")
    init_weights(tp, seed=7)
    sharded = 0
    for name, p in tp.named_parameters():
        if isinstance(p, DTensor):
            sharded += any(pl.is_shard() for pl in p.placements)
            p = p.full_tensor()
        assert torch.equal(p, reference[name]), name
    assert sharded == 1 + 2 * 7 + 1  # embedding, 7 matrices per swiglu block (no biases), output
    tokens = torch.randint(0, spec.vocab, (2, spec.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # 2 of 4 query heads and 1 of 2 kv heads per rank, found from the local weight shapes.
        torch.testing.assert_close(tp(tokens), full(tokens), atol=1e-5, rtol=1e-5)

    # FSDP2: every parameter sharded on dim 0 over the mesh.
    fsdp = build_model(spec, device="meta")
    for block in fsdp.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    fsdp.to_empty(device="cpu")
    from planc.runtime import transformer

    drawn: list[tuple[str, int, int]] = []
    draw = transformer._init_tile

    def counted(name, shape, tile_row, tile_col, std, seed):
        drawn.append((name, tile_row, tile_col))
        return draw(name, shape, tile_row, tile_col, std, seed)

    transformer._init_tile = counted
    try:
        init_weights(fsdp, seed=7)
    finally:
        transformer._init_tile = draw
    # Each rank draws only the tiles its rows overlap (tiles of 64 rows): the embedding's 300 rows
    # padded to 384 (vocab_multiple) are 6 tiles, rows 0-191 on rank 0 (tiles 0-2) and 192-383 on
    # rank 1 (tiles 3-5); the 15 position rows are one tile, which both ranks' 8 and 7 rows overlap.
    assert spec.padded_vocab == 384
    tiles = {n: sorted(r for m, r, _ in drawn if m == n) for n in ("tok_embeddings.weight", "pos_embeddings.weight")}
    assert tiles == {"tok_embeddings.weight": [0, 1, 2] if rank == 0 else [3, 4, 5], "pos_embeddings.weight": [0]}
    for name, p in fsdp.named_parameters():
        assert torch.equal(p.full_tensor(), reference[name]), name
    pos = dict(fsdp.named_parameters())["pos_embeddings.weight"]
    assert pos.to_local().shape[0] == (8 if rank == 0 else 7)  # torch.chunk of 15 rows


@pytest.mark.dist
def test_init_of_tp_and_fsdp_shards_equals_full_init():
    run_ranks("tests/runtime/test_transformer_distributed.py:check_tp_and_fsdp", 2)
