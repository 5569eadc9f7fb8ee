"""Which of an interleaved rank's stages hold gradients at its peak (planc.stages.interleaved_peaks),
checked against torch's own ScheduleInterleaved1F1B order, and what the cost model makes of it."""

import itertools

import pytest

from planc.legality.rules import micro_batch_count
from planc.stages import interleaved_peaks


def _torch_order(p: int, v: int, m: int) -> dict[int, list]:
    """torch's operation order for each rank of ScheduleInterleaved1F1B (the part of its
    constructor that plans it: no process group or stage needed)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    schedule = object.__new__(ScheduleInterleaved1F1B)
    schedule.pp_group_size, schedule._n_microbatches, schedule.n_local_stages = p, m, v
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    return {r: [a for a in schedule._calculate_single_rank_operations(r) if a is not None] for r in range(p)}


def _replayed(actions: list, last_stage: int) -> list[tuple[int, int, int]]:
    """(stage-micro-batches alive, stages whose backward has begun, boundary tensors held by sends)
    as each backward of ``actions`` starts: the forwards' activations live until their backward; a
    stage's gradients exist from its first backward on (the running one's included: it makes
    them as it goes); a finished backward leaves its stage's output held by its forward's send
    (not the model's last stage's, whose output is the loss) and its input gradient by its own send
    (not the first stage's), both until the step's end."""
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    alive: set[tuple[int, int]] = set()
    begun: set[int] = set()
    sends = 0
    moments = []
    for action in actions:
        key = (action.stage_index, action.microbatch_index)
        if action.computation_type == Kind.FORWARD:
            alive.add(key)
            continue
        begun.add(action.stage_index)
        moments.append((len(alive), len(begun), sends))
        alive.discard(key)
        sends += (action.stage_index != last_stage) + (action.stage_index != 0)
    return moments


def _legal():
    for p in (2, 3, 4, 5, 8):
        for v in (2, 3, 4):
            for m in range(1, 4 * p + 2):
                if micro_batch_count("interleaved", p, m) is None:
                    yield p, v, m


def test_interleaved_peaks_are_torchs():
    """For activations a, gradients g per stage and a boundary tensor c, the largest
    a x held + g x stages begun + c x sends over the candidates is the largest over torch's order
    replayed, for several ratios of the three (c = 0: a program whose sends free their tensors)."""
    checked = 0
    weights = itertools.product((1.0,), (0.0, 0.5, 1.5, 6.0), (0.0, 0.05, 0.5, 1.0, 3.0))
    for p, v, m in _legal():
        order = _torch_order(p, v, m)
        for rank, (a, g, c) in itertools.product(range(p), list(weights)):
            replay = max(a * held + g * begun + c * sends for held, begun, sends in _replayed(order[rank], p * v - 1))
            model = max(a * held + g * begun + c * sends for held, begun, sends in interleaved_peaks(p, v, m, rank))
            assert model == pytest.approx(replay), (p, v, m, rank, a, g, c)
        checked += 1
    assert checked > 100


def test_interleaved_peaks_by_hand():
    # torch's order, p 2, v 2, m 2, rank 1 (stages 1 and 3): 1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1.
    # At 3B0 and 3B1 three stage-micro-batches are alive, stage 3 alone has begun; at 1B0 two, and
    # 3B0 and 3B1 have each left an input gradient held by its send (stage 3, the model's last,
    # sends no output); at 1B1 one, 1B0 having left its output and its input gradient too.
    assert interleaved_peaks(2, 2, 2, 1) == ((3, 1, 1), (2, 2, 2), (1, 2, 4))
    # With two rounds (m 4): 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3. Stage
    # 1's first backward comes in the steady phase, which ends at 3B3: 3 alive, and of the 5
    # backwards run 3 were stage 3's (one send each) and 2 stage 1's (two): 7 sends. At 1B3, the
    # last, one alive and 7 backwards run, 4 of them stage 3's: 10.
    assert interleaved_peaks(2, 2, 4, 1) == ((3, 2, 7), (1, 2, 10))


PLAN = """model "tiny" {{
  layers  = 4
  hidden  = 128
  heads   = 4
  vocab   = 256
  seq_len = 64
}}
hardware {{
  device   = "cpu"
  nodes    = 1
  per_node = {devices}
}}
train {{
  global_batch = {batch}
  micro_batch  = 2
  precision    = fp32
}}
layout {{
  tp = 1  pp = 2  dp = {dp}  zero = {zero}  schedule = interleaved  virtual_stages = 2
}}
"""
# By hand (hidden 128, ffn 4 x 128, biases on the linears, LayerNorm with a bias): a block holds
# two norms (2 x 256), wq wk wv wo 4 x (128 x 128 + 128), w1 128 x 512 + 512, w2 512 x 128 + 128;
# the embedding 256 x 128 token rows and 64 x 128 learned positions; the head 256 x 128 and the
# final norm 256. Each of the 4 stages holds one block; rank 0 stages 0 and 2, rank 1 stages 1 and 3.
BLOCK = 2 * 256 + 4 * (128 * 128 + 128) + (128 * 512 + 512) + (512 * 128 + 128)
EMBEDDING = 256 * 128 + 64 * 128
HEAD = 256 * 128 + 256


def _estimate(dp: int, zero: int, m: int):
    from planc.dsl.load import load_plan_text
    from planc.spec import Layout
    from planc.strategies.registry import load_registry
    from planc.verify.predicted import estimate_for

    registry = load_registry()
    text = PLAN.format(devices=2 * dp, batch=2 * dp * m, dp=dp, zero=zero)
    plan = load_plan_text(text, "interleaved.plan", strategies=registry)
    layout = Layout(
        tp=1, pp=2, dp=dp, zero=zero, recompute="none", schedule="interleaved", virtual_stages=2, micro_batch=2
    )
    return estimate_for(plan, layout, registry)


def _stages(dp: int, zero: int, m: int) -> dict:
    return {s.rank: s for s in _estimate(dp, zero, m)[1].stages}


def test_one_round_holds_the_last_stages_fp32_accumulation_alone_under_fsdp():
    """PP 2 x ZeRO-2 x DP 2, 2 micro-batches (one round): at each rank's peak FSDP holds its last
    stage's unsharded fp32 gradients only (simulated: the second rank's 0.88 of the 1.64 MiB)."""
    stages = _stages(dp=2, zero=2, m=2)
    assert stages[0].stages_without_grads == stages[1].stages_without_grads == 1
    assert stages[0].accumulated_grads == 4 * BLOCK  # stage 2: no embedding
    assert stages[1].accumulated_grads == 4 * (BLOCK + HEAD)  # stage 3, the head's
    assert stages[1].grads_at_peak == 4 * (BLOCK + HEAD)


def test_one_round_without_data_parallelism_holds_the_begun_stages_grads():
    stages = _stages(dp=1, zero=0, m=2)
    assert stages[0].absent_grads == 4 * (BLOCK + EMBEDDING)  # stage 0, the embedding's
    assert stages[1].absent_grads == 4 * BLOCK
    assert stages[1].grads == 4 * (2 * BLOCK + HEAD)  # the model states: every gradient after the step's backward
    assert stages[1].grads_at_peak == 4 * (BLOCK + HEAD)


def test_two_rounds_hold_every_stages_gradients():
    stages = _stages(dp=2, zero=2, m=4)
    assert stages[1].stages_without_grads == 0
    assert stages[1].accumulated_grads == 4 * (2 * BLOCK + HEAD)


def test_zero3_one_round_keeps_the_running_stages_blocks_gathered():
    """ZeRO-3 under a pipeline keeps a block gathered from its backward to the stage's reduction:
    with one round, at the peak, the running stage's one block (fp32, 4 bytes a parameter)."""
    name = "blocks' parameters gathered from their backward on"

    def gathered(m: int) -> list[float]:
        return [next(t.value for t in s.transient if t.name == name) for s in _stages(dp=2, zero=3, m=m).values()]

    assert gathered(2) == [4 * BLOCK, 4 * BLOCK]
    assert gathered(4) == [4 * 2 * BLOCK, 4 * 2 * BLOCK]  # two rounds: both stages' blocks


def test_the_first_ranks_embedding_backward_finds_the_first_stages_accumulation():
    """One round, FSDP (ZeRO-2, fp32): rank 0's first embedding backward comes after its second
    stage's backwards and reduction. Beyond the peak's gradients (stage 2's accumulation, 4 BLOCK)
    it then holds stage 0's (4 (BLOCK + EMBEDDING)) and stage 2's shards (4 BLOCK / 2), stage 2's
    accumulation gone and its parameters resharded (4 BLOCK)."""
    from planc.cost.data_parallel import gained_by_the_embedding_backward

    ctx, est = _estimate(dp=2, zero=2, m=2)
    first, last = sorted(est.stages, key=lambda s: s.rank)
    gained = 4 * (BLOCK + EMBEDDING) + 4 * BLOCK / 2 - 4 * BLOCK - 4 * BLOCK
    assert gained_by_the_embedding_backward(ctx, first) == gained
    assert gained_by_the_embedding_backward(ctx, last) == 0.0  # no embedding


def test_explain_says_which_gradients_come_after_the_peak():
    from planc.dsl.load import load_plan_text
    from planc.explain.memory_table import memory_table
    from planc.spec import Layout
    from planc.strategies.registry import load_registry
    from planc.verify.predicted import estimate_for

    registry = load_registry()
    text = PLAN.format(devices=3, batch=8, dp=1, zero=0).replace("layers  = 4", "layers  = 6")
    plan = load_plan_text(text.replace("pp = 2", "pp = 3"), "p3.plan", strategies=registry)
    layout = Layout(tp=1, pp=3, dp=1, zero=0, recompute="none", schedule="interleaved", virtual_stages=2, micro_batch=2)
    table = "\n".join(memory_table(estimate_for(plan, layout, registry)[1], plan))
    assert "1 of the rank's stages begin theirs after the peak" in table, table
