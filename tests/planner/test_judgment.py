"""The judgment suite: scenarios from published practice, each with the layout an expert would
accept (tests/planner/judgment_scenarios.py has the plans, their sources and the predicates), and
every example plan getting what its comment promises."""

from pathlib import Path

import pytest
from judgment_scenarios import SCENARIOS

from planc.dsl.load import load_plan
from planc.planner import choose
from planc.spec import build_plan
from planc.strategies.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = load_registry()


def _param(s):
    marks = [pytest.mark.xfail(strict=False, reason=s.needs)] if s.needs else []
    return pytest.param(s, id=s.name, marks=marks)


@pytest.mark.parametrize("scenario", [_param(s) for s in SCENARIOS])
def test_an_expert_accepts_the_choice(scenario):
    choice = choose(build_plan(scenario.plan), REGISTRY)
    if scenario.on_choice:
        assert scenario.accept(choice), f"{scenario.name}: expected {scenario.expect} ({scenario.source})"
        return
    assert choice.fits, f"{scenario.name}: nothing fits ({scenario.source})"
    # Whatever is chosen leaves the headroom free: it fits memory x (1 - headroom).
    plan = build_plan(scenario.plan)
    assert choice.estimate.memory_bytes <= plan.hardware.memory * (1 - plan.hardware.headroom)
    assert scenario.accept(choice.layout), (
        f"{scenario.name}: chose {choice.layout.describe()}, an expert expects {scenario.expect} ({scenario.source})"
    )


def test_there_are_at_least_25_scenarios_each_with_a_source():
    assert len(SCENARIOS) >= 25
    assert all(s.source and s.expect for s in SCENARIOS)


def _example(name):
    plan = load_plan(ROOT / "plans" / name, strategies=REGISTRY)
    return plan, choose(plan, REGISTRY)


# -- every example plan gets what its comment promises -------------------------------------------


def test_gpt2_small_example_gets_ddp():
    # "124 M parameters fit any one GPU many times over, so it should pick plain data parallelism (DDP)"
    _, choice = _example("gpt2-small-8xa100.plan")
    assert (choice.layout.tp, choice.layout.pp, choice.layout.zero) == (1, 1, 0)


def test_llama3_70b_example_keeps_tp8_and_the_headroom():
    # "Tensor parallelism across the 8 GPUs of each node"; issue 12: not chosen at 79.98 GiB of an H100
    # that shows programs 81559 MiB = 79.6 GiB.
    plan, choice = _example("llama3-70b-64xh100.plan")
    assert choice.fits and choice.layout.tp == 8 and choice.layout.sequence_parallel
    assert plan.hardware.memory == 81559 * 2**20
    assert choice.estimate.memory_bytes <= 0.95 * 81559 * 2**20


def test_llama3_8b_example_shards_or_splits_the_model():
    # "plain DDP cannot fit; the planner weighs ZeRO/FSDP against tensor parallelism"; pp = 1 fixed.
    _, choice = _example("llama3-8b-8xh100.plan")
    assert choice.fits and choice.layout.pp == 1
    assert choice.layout.zero >= 1 or choice.layout.tp > 1
    assert all(r.fits is not True for r in choice.rejected if r.strategy == "DDP")


def test_gpt_1t_example_finds_a_pipeline():
    # "the planner is left to find the pipeline depth (the paper used 64)"
    _, choice = _example("gpt-1t-3072xa100.plan")
    assert choice.layout.tp == 8 and choice.layout.pp >= 16


def test_gpt3_175b_example_pipelines_with_tp8():
    # "Tensor parallelism inside each node; the planner chooses the pipeline depth" (Megatron: TP 8 with
    # interleaved 1F1B)
    _, choice = _example("gpt3-175b-1024xa100.plan")
    assert choice.fits and choice.layout.tp == 8 and choice.layout.pp > 1


def test_tiny_cpu_example_is_ddp_over_4():
    # "Fixed, so the run is the same everywhere: DDP over 4 ranks."
    _, choice = _example("tiny-cpu.plan")
    assert choice.fixed and choice.fits and (choice.layout.dp, choice.layout.zero) == (4, 0)


def test_cpu_3d_example_is_2x2x2():
    _, choice = _example("cpu-3d.plan")
    assert choice.fits and (choice.layout.tp, choice.layout.pp, choice.layout.dp) == (2, 2, 2)


def test_from_hf_config_example_splits_heads_over_2():
    _, choice = _example("from-hf-config.plan")
    assert choice.fits and choice.layout.tp == 2
