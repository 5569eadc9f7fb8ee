"""build_plan: every problem found, addressed by key path, with an actionable hint."""

import pytest

from planc.spec import Plan, SpecError, build_plan
from planc.units import Quantity

BASE = {
    "model": {"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 64},
    "hardware": {"device": "A100-80GB", "nodes": 2, "per_node": 8},
    "train": {"global_batch": 64},
}


def plan_with(**blocks):
    raw = {k: dict(v) for k, v in BASE.items()}
    for block, values in blocks.items():
        raw.setdefault(block, {}).update(values)
    return build_plan(raw)


def issues_of(**blocks):
    with pytest.raises(SpecError) as info:
        plan_with(**blocks)
    return {(i.path, i.message): i.hint for i in info.value.issues}


def test_valid_plan_has_derived_values():
    plan = plan_with()
    assert plan.hardware.world_size == 16  # 2 nodes x 8
    assert plan.tokens_per_step == 64 * 64  # global_batch x seq_len
    assert plan.model.kv_heads == 4 and plan.model.ffn == 512  # defaults: heads, 4h


def test_json_round_trip_recomputes_derived_fields():
    plan = plan_with(layout={"tp": 2, "zero": 1})
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert '"params"' in plan.to_json()


@pytest.mark.parametrize(
    "blocks,path,fragment",
    [
        ({"model": {"heads": 3}}, ("model", "heads"), "heads = 3 does not divide hidden = 128"),
        ({"model": {"kv_heads": 3}}, ("model", "kv_heads"), "kv_heads = 3 does not divide heads = 4"),
        ({"layout": {"tp": 16}}, ("layout", "tp"), "tp = 16 does not divide heads = 4"),
        ({"model": {"heads": 16}, "layout": {"tp": 16}}, ("layout", "tp"), "tp = 16 exceeds per_node = 8"),
        ({"layout": {"pp": 5}}, ("layout", "pp"), "pp = 5 is more pipeline stages than layers = 4"),
        ({"layout": {"tp": 2, "pp": 2, "dp": 2}}, ("layout",), "= 8, but nodes x per_node = 2 x 8 = 16"),
        ({"layout": {"dp": 16}, "train": {"global_batch": 24}}, ("train", "global_batch"), "not divisible by dp = 16"),
        ({"layout": {"pp": 1, "schedule": "1f1b"}}, ("layout", "schedule"), "needs pp > 1"),
        ({"layout": {"tp": 1, "sequence_parallel": True}}, ("layout", "sequence_parallel"), "needs tp > 1"),
        ({"train": {"micro_batch": 128}}, ("train", "micro_batch"), "larger than global_batch"),
    ],
)
def test_cross_field_checks(blocks, path, fragment):
    found = issues_of(**blocks)
    assert any(p == path and fragment in message for (p, message) in found), found


def test_unit_of_wrong_kind_and_missing_unit():
    found = issues_of(hardware={"memory": Quantity.of(300, "GB/s"), "peak": 312})
    messages = {p: m for (p, m) in found}
    assert "300 GB/s is a bandwidth" in messages[("hardware", "memory")]
    assert "needs a unit" in messages[("hardware", "peak")]


def test_unknown_key_and_value_get_did_you_mean():
    found = issues_of(model={"hiden": 3}, layout={"recompute": "ful"})
    hints = {p: h for (p, _), h in found.items()}
    assert hints[("model", "hiden")] == "did you mean 'hidden'?"
    assert hints[("layout", "recompute")] == "did you mean 'full'?"


def test_preset_keys_are_blamed_on_the_preset_line():
    # kv_heads comes from the preset; the tp that breaks it is the user's.
    with pytest.raises(SpecError) as info:
        build_plan(
            {
                "model": {"preset": "llama3-8b"},
                "hardware": {"device": "H100-SXM"},
                "train": {"global_batch": 8},
                "layout": {"tp": 16},
            }
        )
    assert info.value.issues[0].path == ("layout", "tp")
    with pytest.raises(SpecError) as info:
        build_plan(
            {
                "model": {"preset": "llama3-8b", "heads": 30},
                "hardware": {"device": "H100-SXM"},
                "train": {"global_batch": 8},
            }
        )
    paths = [i.path for i in info.value.issues]
    assert ("model", "heads") in paths  # written by the user: points at their line


def test_unknown_plugin_when_registry_known():
    raw = {**BASE, "uses": [{"name": "powersdg", "options": {}}]}
    with pytest.raises(SpecError) as info:
        build_plan(raw, known_strategies={"powersgd", "ddp"})
    issue = info.value.issues[0]
    assert issue.path == ("uses", 0, "name") and "did you mean 'powersgd'?" in issue.hint


def test_zero_and_negative_values_rejected():
    found = issues_of(model={"layers": 0}, train={"lr": -1.0})
    messages = {p: m for (p, m) in found}
    assert messages[("model", "layers")] == "layers must be greater than 0, got 0"
    assert messages[("train", "lr")] == "lr must be greater than 0, got -1"


def test_custom_device_needs_its_numbers():
    found = issues_of(hardware={"device": "TPU-v9"})
    (path, message), hint = next(iter(found.items()))
    assert path == ("hardware", "device") and "memory, peak" in hint
    plan = plan_with(
        hardware={
            "device": "TPU-v9",
            "memory": Quantity.of(96, "GiB"),
            "peak": Quantity.of(900, "TFLOPS"),
            "intra_node_bw": Quantity.of(400, "GB/s"),
            "inter_node_bw": Quantity.of(50, "GB/s"),
        }
    )
    assert plan.hardware.memory == 96 * 2**30


def test_a_custom_device_may_give_its_network_per_node():
    # docs/language.md: inter_node_bw or inter_node_bw_per_node, "give one of the two" -- for a
    # custom device too (it was told its device was unknown and asked for inter_node_bw)
    plan = plan_with(
        hardware={
            "device": "TPU-v9",
            "per_node": 4,
            "memory": Quantity.of(96, "GiB"),
            "peak": Quantity.of(900, "TFLOPS"),
            "intra_node_bw": Quantity.of(400, "GB/s"),
            "inter_node_bw_per_node": Quantity.of(100, "GB/s"),
        }
    )
    assert plan.hardware.inter_node_bw == 25e9  # 100 GB/s over the node's 4 devices


def test_bf16_on_a_device_without_bf16_is_refused_with_what_to_do():
    """V100 (Volta) tensor cores take fp16 only (NVIDIA V100 data sheet; bf16 arrived with Ampere),
    so a bf16 plan there would be costed at a rate the device cannot reach."""
    found = issues_of(hardware={"device": "V100-32GB", "nodes": 1})
    [(message, hint)] = [(m, h) for (p, m), h in found.items() if p == ("train", "precision")]
    assert "V100-32GB has no bf16" in message
    assert "precision = fp32" in hint and "bf16 = true" in hint
    assert plan_with(hardware={"device": "V100-32GB", "nodes": 1}, train={"precision": "fp32"}).hardware.bf16 is False
    assert plan_with(hardware={"device": "V100-32GB", "nodes": 1, "bf16": True}).train.precision == "bf16"
    assert plan_with().hardware.bf16 is True  # A100: bf16 tensor cores


@pytest.mark.parametrize(
    "key, written, side",
    [
        ("memory", Quantity.of(512, "KiB"), "below"),  # under 1 MiB
        ("memory", Quantity.of(17, "TiB"), "above"),  # over 16 TiB
        ("peak", Quantity.of(0.5, "GFLOPS"), "below"),  # under 1 GFLOPS
        ("peak", Quantity.of(200, "PFLOPS"), "above"),  # over 100 PFLOPS
        ("hbm_bw", Quantity.of(200, "TB/s"), "above"),  # over 100 TB/s
        ("intra_node_bw", Quantity.of(500, "KB/s"), "below"),  # under 1 MB/s
        ("inter_node_bw", Quantity.of(1e-300, "GB/s"), "below"),
        ("nvls_all_reduce_bw", Quantity.of(1e-300, "GB/s"), "below"),
    ],
)
def test_hardware_numbers_outside_any_device_are_refused(key, written, side):
    found = issues_of(hardware={key: written})
    assert [p for p, _ in found] == [("hardware", key)], found
    (((_, message), hint),) = found.items()
    assert message.startswith(f"{key} is ") and f", {side} the plausible range " in message
    assert hint.startswith("check the number and its unit")


def test_an_absurd_peak_is_one_error_not_two():
    """peak_fp32 follows a written peak at the preset's ratio: it is not reported again."""
    found = issues_of(hardware={"peak": Quantity.of(0.001, "GFLOPS")})  # peak_fp32: 62.5 kFLOPS at the A100's 1/16
    assert [p for p, _ in found] == [("hardware", "peak")], found


def test_hardware_far_beyond_todays_is_accepted():
    """The bounds leave room for decades: 8 TiB, 50 PFLOPS, 50 TB/s links, a slow 2 MB/s WAN."""
    plan = plan_with(
        hardware={
            "memory": Quantity.of(8, "TiB"),
            "peak": Quantity.of(50, "PFLOPS"),
            "hbm_bw": Quantity.of(90, "TB/s"),
            "intra_node_bw": Quantity.of(50, "TB/s"),
            "inter_node_bw": Quantity.of(2, "MB/s"),
        }
    )
    assert plan.hardware.memory == 8 * 2**40 and plan.hardware.inter_node_bw == 2e6
