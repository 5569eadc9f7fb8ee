"""DCP checkpoints across layouts, checked against the single-process reference trainer.

One 2-process gloo launch:
  0. DDP + ZeRO-1 (ZeroRedundancyOptimizer, dp = 2) trains steps 1-2 and saves step 2 elsewhere;
  1. FSDP2 (dp = 2) trains steps 1-2 -- its losses equal the reference -- and saves step 2;
  2. a tensor-parallel model (tp = 2) loads that checkpoint (dim-0 FSDP shards -> column/row TP
     shards, Adam moments included) and trains steps 3-4: the reference's losses again;
  3. clip_grad_norm_ over a parameter set split between the two ranks (as pipeline stages) with
     ``pp_group`` equals torch's norm over the whole set.
Then this process (world size 1, no process group) resumes both checkpoints with the reference
trainer (plain AdamW over the whole model) and must reproduce the uninterrupted run's steps 3-4.
"""

import pytest
import torch
from ranks import run_ranks

from planc.runtime.reference import train_reference
from planc.spec import Plan, build_plan

MODEL = dict(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, vocab_multiple=1)  # gelu, bias, learned
TOL = 1e-5  # fp32, reductions in another order


def make_plan() -> Plan:
    return build_plan(
        {
            "model": MODEL,
            "hardware": {"device": "cpu"},
            "train": dict(global_batch=8, micro_batch=2, lr=3e-3, warmup_steps=1, steps=4, precision="fp32"),
            "checkpoint": dict(every=2, keep=2),
        }
    )


def _train_steps(model, optimizer, scheduler, plan, steps, dp_rank, dp):
    import torch.distributed as dist

    from planc.runtime.data import build_data, inputs_and_targets, local_batch, split_micro_batches
    from planc.runtime.optim import clip_grad_norm_
    from planc.runtime.transformer import loss_fn

    data = build_data(plan.train, plan.model)
    losses = []
    for step in steps:
        rows = local_batch(data, step, dp_rank, dp, plan.train.micro_batch)
        micro = split_micro_batches(rows, plan.train.micro_batch)
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for batch in micro:
            inputs, targets = inputs_and_targets(batch)
            loss = loss_fn(model(inputs), targets) / len(micro)
            loss.backward()
            total += loss.detach()
        clip_grad_norm_(model.parameters(), plan.train.grad_clip)
        optimizer.step()
        scheduler.step()
        dist.all_reduce(total)  # mean over ranks: dp ranks hold their rows' loss, tp ranks the same loss
        losses.append(total.item() / dist.get_world_size())
    return losses


def ranks(payload: dict) -> None:
    """Steps 0-3 on each of the 2 ranks (tests/ranks.py)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    from planc.runtime.checkpoint import load_checkpoint
    from planc.runtime.checkpoint_write import save_checkpoint
    from planc.runtime.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_, parameter_groups
    from planc.runtime.transformer import build_model, init_weights, loss_fn

    rank, world_size = dist.get_rank(), dist.get_world_size()
    plan_json, ckpt_dir, zero_dir, reference = (payload[k] for k in ("plan", "checkpoints", "zero", "reference"))
    plan = Plan.from_json(plan_json)
    mesh = init_device_mesh("cpu", (world_size,))

    def materialise(model):
        model.to_empty(device="cpu")
        init_weights(model, plan.train.seed)
        optimizer = build_optimizer(model.parameters(), plan.train)
        return model, optimizer, build_lr_scheduler(optimizer, plan.train)

    # 0. DDP + ZeRO-1 over dp = 2: each rank keeps Adam states of its share of the parameters only.
    bare = build_model(plan.model)
    init_weights(bare, plan.train.seed)
    t = plan.train
    decayed, not_decayed = parameter_groups(bare.parameters(), t.weight_decay)  # what build_optimizer uses
    zero = ZeroRedundancyOptimizer(
        decayed["params"],
        optimizer_class=torch.optim.AdamW,
        lr=t.lr,
        betas=(t.beta1, t.beta2),
        weight_decay=decayed["weight_decay"],
    )
    zero.add_param_group(not_decayed)
    zero_sched = build_lr_scheduler(zero, t)
    losses = _train_steps(DistributedDataParallel(bare), zero, zero_sched, plan, range(0, 2), rank, world_size)
    assert max(abs(a - b) for a, b in zip(losses, reference[:2])) < TOL, (losses, reference[:2])
    save_checkpoint(zero_dir, 2, [bare], [zero], [zero_sched])

    # 1. FSDP2 over dp = 2, steps 1-2, then a checkpoint.
    fsdp = build_model(plan.model, device="meta")
    for block in fsdp.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    fsdp, fsdp_opt, fsdp_sched = materialise(fsdp)
    losses = _train_steps(fsdp, fsdp_opt, fsdp_sched, plan, range(0, 2), dp_rank=rank, dp=world_size)
    assert max(abs(a - b) for a, b in zip(losses, reference[:2])) < TOL, (losses, reference[:2])
    save_checkpoint(ckpt_dir, 2, [fsdp], [fsdp_opt], [fsdp_sched], keep=2)

    # 2. Tensor parallel over tp = 2 loads it (another sharding of every matrix) and trains steps 3-4.
    tp = build_model(plan.model, device="meta")
    layout = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in tp.layers:
        layout |= {f"layers.{i}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}
        layout |= {
            f"layers.{i}.attention.wo": RowwiseParallel(),
            f"layers.{i}.feed_forward.w1": ColwiseParallel(),
            f"layers.{i}.feed_forward.w2": RowwiseParallel(),
        }
    parallelize_module(tp, mesh, layout)
    tp, tp_opt, tp_sched = materialise(tp)
    metadata = load_checkpoint(ckpt_dir, [tp], [tp_opt], [tp_sched])
    assert metadata["step"] == 2
    fsdp_params = dict(fsdp.named_parameters())
    for name, p in tp.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        assert torch.equal(full, fsdp_params[name].full_tensor()), name
    losses = _train_steps(tp, tp_opt, tp_sched, plan, range(2, 4), dp_rank=0, dp=1)
    assert max(abs(a - b) for a, b in zip(losses, reference[2:4])) < TOL, (losses, reference[2:4])

    # 3. Global norm over "pipeline stages": rank 0 holds the first half of the parameters, rank 1 the rest.
    full = build_model(plan.model)
    init_weights(full, seed=5)
    tokens = torch.randint(0, plan.model.vocab, (2, plan.model.seq_len + 1), generator=torch.Generator().manual_seed(1))
    loss_fn(full(tokens[:, :-1]), tokens[:, 1:]).backward()
    params = list(full.parameters())
    expected = torch.nn.utils.get_total_norm([p.grad for p in params])
    half = len(params) // 2
    mine = params[:half] if rank == 0 else params[half:]
    before = [p.grad.clone() for p in mine]
    norm = clip_grad_norm_(mine, 1e-3, pp_group=dist.group.WORLD)
    torch.testing.assert_close(norm, expected, rtol=1e-6, atol=0)
    coefficient = 1e-3 / (expected + 1e-6)  # torch's clip coefficient, < 1 here
    for p, grad in zip(mine, before):
        torch.testing.assert_close(p.grad, grad * coefficient)


@pytest.mark.dist
def test_checkpoint_moves_between_fsdp_tp_and_one_process(tmp_path):
    plan = make_plan()
    ckpt, zero_ckpt = tmp_path / "checkpoints", tmp_path / "zero"
    uninterrupted = train_reference(plan)
    payload = {
        "plan": plan.to_json(),
        "checkpoints": str(ckpt),
        "zero": str(zero_ckpt),
        "reference": uninterrupted.losses,
    }
    run_ranks("tests/runtime/test_checkpoint_distributed.py:ranks", 2, payload)
    # 4. One process, no process group: resume each checkpoint in the reference trainer.
    for directory in (ckpt, zero_ckpt):
        resumed = train_reference(plan, checkpoint_dir=directory)
        assert resumed.first_step == 2
        assert max(abs(a - b) for a, b in zip(resumed.losses, uninterrupted.losses[2:])) < TOL, directory.name
        assert [p.name for p in sorted(directory.iterdir())] == ["step-00000002", "step-00000004"]
