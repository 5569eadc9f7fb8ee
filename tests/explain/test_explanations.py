"""Explanations that name the right thing (issue 12, points 6-8): rejection rows name the real
blocker and show a layout of their own rung; when nothing fits, the fewest fixed keys change;
printed totals add up; link bandwidths say what they are per; the SVG legend stays inside the
picture; the training totals carry the model's uncertainty; ``--json`` is always one object."""

import json
import re
import xml.etree.ElementTree as ET
from itertools import combinations

import pytest

from planc.cli import main
from planc.cost.uncertainty import step_time_uncertainty
from planc.explain.report import render_text, to_dict
from planc.explain.svg import render_svg, text_width
from planc.explain.words import rejection_reason, suggestion_text
from planc.planner import Limit, choose, rung_of, search
from planc.planner.suggest import Suggestion, _freed, fixed_keys, growth
from planc.spec import build_plan
from planc.spec.presets.hardware import HARDWARE_PRESETS
from planc.strategies.registry import load_registry
from planc.units import Quantity

GiB = 2**30


def plan(model, device="H100-SXM", nodes=1, per_node=8, gb=8, layout=None, **train):
    return build_plan(
        {
            "model": model,
            "hardware": {"device": device, "nodes": nodes, "per_node": per_node},
            "train": {"global_batch": gb, **train},
            "layout": layout or {},
        }
    )


@pytest.fixture(scope="module")
def long_context():
    """Llama 3 8B at 128 k context on one H100 node (the issue's case)."""
    p = plan({"preset": "llama3-8b", "seq_len": 131072})
    return p, choose(p, load_registry())


def test_recompute_rows_name_the_activations_not_the_model_states(long_context):
    _, choice = long_context
    rows = {r.strategy: r for r in choice.rejected}
    # Under ZeRO-3 over 8 ranks the model states are 16 B x 8.03 B / 8 = 15 GiB, far below 80 GiB:
    # what rules out recomputation without TP is the activations (the bf16 logits of 128 k tokens,
    # their gradient written over them, are 131072 x 128256 x 2 B = 31.3 GiB; under full
    # recomputation the 32 blocks' inputs as much again), not "model states alone".
    for name in ("+ selective recompute", "+ full recompute"):
        row = rows[name]
        assert row.limit is not Limit.MODEL_STATES, rejection_reason(row)
        assert row.memory_part and row.memory_part[0] == "activations", rejection_reason(row)
        assert row.memory_part[1] > 60 * 2**30, rejection_reason(row)


def test_every_row_shows_a_layout_of_its_own_rung(long_context):
    _, choice = long_context
    for row in choice.rejected:
        if row.layout is not None and row.limit is not Limit.MODEL_STATES:
            assert rung_of(row.layout) == row.rung, rejection_reason(row)
    selective = next(r for r in choice.rejected if r.strategy == "+ selective recompute")
    assert selective.layout.recompute == "selective" and "full recompute" not in rejection_reason(selective)


@pytest.fixture(scope="module")
def llama405_fixed():
    """405B on 16 x 8 H100s with tp = 8, pp = 16 and recompute = none fixed: nothing fits."""
    p = plan({"preset": "llama3-405b"}, nodes=16, gb=256, layout={"tp": 8, "pp": 16, "recompute": "none"}, steps=10)
    return p, choose(p, load_registry())


def test_when_nothing_fits_the_fewest_fixed_keys_change(llama405_fixed):
    p, choice = llama405_fixed
    s = choice.suggestion
    assert not choice.fits and s is not None and s.layout is not None
    changed = [k for k, _ in s.changed]
    registry = load_registry()
    # No smaller set of fixed keys lets anything fit (each freed set searched by the planner).
    for size in range(1, len(changed)):
        for subset in combinations(fixed_keys(p), size):
            assert not search(_freed(p, subset), registry).fitting, subset
    # The keys not named keep the plan's values.
    for key in {"tp", "pp", "recompute"} - set(changed):
        assert getattr(s.layout, key) == getattr(p.layout, key)
    text = suggestion_text(s)
    assert text.count(" = ") == len(changed) and "set " in text and "True" not in text


def test_405b_with_recompute_none_is_told_to_set_recompute_full_under_megatron():
    """The issue's case, predicted for Megatron-Core (receive buffers only for the micro-batches in
    flight): freeing recompute alone fits, so that is the whole suggestion, and tp, pp stay.
    Under planc's own program torch.distributed.pipelining holds one receive buffer per
    chunk-micro-batch (512 x 64 MiB = 32 GiB at m = 256), so there pp must change too."""
    from planc.cost import PROFILES

    p = plan({"preset": "llama3-405b"}, nodes=16, gb=256, layout={"tp": 8, "pp": 16, "recompute": "none"})
    choice = choose(p, load_registry(), profile=PROFILES["megatron-core-2024"])
    assert choice.suggestion.changed == (("recompute", "full"),)
    assert (choice.suggestion.layout.tp, choice.suggestion.layout.pp) == (8, 16)
    assert "set recompute = full (not none) and it fits" in suggestion_text(choice.suggestion)


def test_suggestions_print_values_as_the_plan_language_writes_them():
    from planc.explain.words import plan_value
    from planc.spec import Layout

    layout = Layout(tp=2, pp=1, dp=4, zero=3, recompute="full", schedule=None, micro_batch=1)
    s = Suggestion(GiB, freed=(("sequence_parallel", True),), changed=(("sequence_parallel", False),), layout=layout)
    assert "set sequence_parallel = false (not true) and it fits" in suggestion_text(s)
    assert suggestion_text(Suggestion(1.0, nodes=1, per_node=4)).endswith("4 devices (one node of 4)")
    assert (plan_value(True), plan_value(False), plan_value(None)) == ("true", "false", "none")


def test_a_one_device_box_grows_inside_its_node_first():
    p = plan({"preset": "llama3-8b"}, device="A100-80GB", per_node=1)
    # A100 servers hold 8 devices: 2, 4, 8 in one node, then nodes of 8.
    assert growth(p)[:4] == [(1, 2), (1, 4), (1, 8), (2, 8)]
    choice = choose(p, load_registry())
    # Nothing fits: the least memory-hungry layout is shown (full recomputation keeps the least).
    assert choice.layout.recompute == "full"
    assert not choice.fits and choice.suggestion.nodes == 1 and "nodes ×" not in suggestion_text(choice.suggestion)


def test_a_layout_that_does_not_fit_gets_no_mfu(llama405_fixed):
    p, choice = llama405_fixed
    text = render_text(p, choice)
    assert not re.search(r"MFU \d", text) and "device-hours" not in text
    assert "throughput none: the layout does not fit" in text
    d = to_dict(p, choice)
    assert d["throughput"] is None and d["training"] is None


def _memory_groups(text):
    """{group: (printed total, [printed rows])} and the printed total, from explain's memory list."""
    lines = text.split("  memory per device")[1].split("\n\n")[0].splitlines()[1:]
    groups, current, total = {}, None, None
    for line in lines:
        if line.strip().startswith("total"):
            total = float(line.split()[1])
            continue
        name, value = line[:-8].strip(), float(line[-8:])
        if line.startswith("      "):
            groups[current][1].append(value)
        else:
            current = name
            groups[current] = (value, [])
    return groups, total


def test_every_printed_memory_total_is_the_sum_of_its_rows(long_context):
    p, choice = long_context
    groups, total = _memory_groups(render_text(p, choice))
    assert set(groups) == {"model states", "activations", "buffers and overheads"}
    assert groups["activations"][1], "the logits and the recompute working set are listed under activations"
    for name, (value, rows) in groups.items():
        assert value == pytest.approx(sum(rows), abs=0.005 * len(rows) + 1e-9), name  # rounding of 2 decimals
    assert total == pytest.approx(sum(v for v, _ in groups.values()), abs=0.015)


def test_link_columns_say_what_is_per_device_and_what_is_aggregate():
    # GPT-2 XL on 2 A100 nodes: DP 16 spans both nodes with 8 members in each, so its ring crosses
    # each node through 8 NICs: 8 x 24 GB/s = 192 GB/s per node (NCCL moves 96% of a 25 GB/s HDR NIC:
    # the header's "links" line says so), under the 231 GB/s NVLink hops inside a node move.
    p = plan({"preset": "gpt2-xl"}, device="A100-80GB", nodes=2, gb=512, layout={"tp": 1, "pp": 1, "dp": 16})
    text = render_text(p, choose(p, load_registry()))
    assert "network 25 GB/s per device" in text.splitlines()[2]
    assert "NVLink 77% = 231 GB/s, network 96% = 24 GB/s" in text.splitlines()[3]
    dp = next(line for line in text.splitlines() if line.strip().startswith("DP "))
    assert dp.endswith("network 192 GB/s per node (8 NICs × 24 GB/s each)")
    (comm,) = [c for c in to_dict(p, choose(p, load_registry()))["comm"] if c["group"] == "dp"]
    assert comm["bandwidth"] == pytest.approx(8 * 24e9) and comm["bandwidth_per"] == "node"
    hardware = to_dict(p, choose(p, load_registry()))["hardware"]
    assert (hardware["inter_node_bw"], hardware["inter_node_link_efficiency"]) == (25e9, 0.96)
    assert (hardware["intra_node_link_efficiency"], hardware["nvls_all_reduce_bw"]) == (0.77, None)
    # On H100s the 8 NICs (8 x 48 = 384 GB/s) outrun what NVLink's hops move (370): capped.
    h100 = plan({"preset": "gpt2-xl"}, nodes=2, gb=512, layout={"tp": 1, "pp": 1, "dp": 16})
    rows = render_text(h100, choose(h100, load_registry())).splitlines()
    dp = next(line for line in rows if line.strip().startswith("DP "))
    assert "network 369 GB/s per device (capped by NVLink" in dp and "8 NICs × 48 GB/s = 384 GB/s" in dp


def test_the_svg_legend_stays_inside_the_picture(long_context):
    from dataclasses import replace

    p, choice = long_context
    # The longest legend: every part present, each with a long number.
    worst = choice.estimate.memory
    m = replace(worst, params=999.9 * GiB, master=999.9 * GiB)
    est = replace(choice.estimate, stages=tuple(m if s is worst else s for s in choice.estimate.stages))
    svg = ET.fromstring(render_svg(p, replace(choice, estimate=est)))
    width = float(svg.get("width"))
    texts = [t for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    names = ("parameters", "master weights", "gradients", "optimizer", "activations", "buffers")
    legend = [t for t in texts if (t.text or "").startswith(names)]
    assert len(legend) == 6
    for t in texts:
        assert float(t.get("x")) + text_width(t.text, float(t.get("font-size"))) <= width, t.text
    # The bound is conservative: at least Arial's average advance (0.55 em) per character.
    assert all(text_width(t.text, 11) >= 0.55 * 11 * len(t.text) for t in legend)


def test_explain_shows_the_time_to_train_the_plans_steps_with_its_band():
    p = plan({"preset": "gpt2"}, device="A100-80GB", gb=16, steps=100)
    choice = choose(p, load_registry())
    d = to_dict(p, choice)
    t = d["training"]
    assert t["tokens"] == 100 * 16 * 1024  # steps x global_batch x seq_len
    assert t["seconds"] == pytest.approx(100 * d["time"]["step_s"])
    assert t["device_hours"] == pytest.approx(t["seconds"] * 8 / 3600)
    band = step_time_uncertainty()
    assert t["uncertainty"] == band and t["seconds_range"] == pytest.approx(
        [t["seconds"] * (1 - band), t["seconds"] * (1 + band)]
    )
    text = render_text(p, choice)
    assert f"±{band:.0%}" in text.split("step time")[1].split("=")[0]
    assert "100 steps × 16.4 k tokens = 1.64 M tokens" in text and "device-hours" in text


BAD = 'model { preset = "gpt2" }\nhardware { device = "A100-80GB" }\ntrain { global_batch = 64 }\nlayout { tp = 5 }\n'
TOO_BIG = (
    'model { preset = "llama3-70b" }\nhardware { device = "A100-80GB"  per_node = 1 }\ntrain { global_batch = 1 }\n'
)


@pytest.mark.parametrize("command", ["check", "explain"])
@pytest.mark.parametrize("case", ["bad plan", "missing file", "cannot fit"])
def test_json_output_is_one_object_with_an_error_on_failure(command, case, tmp_path, capsys):
    path = tmp_path / "x.plan"
    if case != "missing file":
        path.write_text(BAD if case == "bad plan" else TOO_BIG)
    code = main([command, "--json", str(path)])
    out = capsys.readouterr().out
    document = json.loads(out)  # exactly one JSON value: json.loads refuses trailing data
    assert isinstance(document, dict)
    if case == "cannot fit" and command == "check":
        assert code == 0 and "error" not in document  # a valid plan; fitting is explain's question
        return
    # docs/language.md: {"error": {"message", "location", "hint", "errors"}}, errors a list whatever failed
    assert code == 1 and set(document["error"]) == {"message", "location", "hint", "errors"}
    first = {k: document["error"][k] for k in ("message", "location", "hint")}
    assert isinstance(document["error"]["errors"], list) and document["error"]["errors"][0] == first
    if case == "missing file":
        assert document["error"]["errors"] == [first] and "no such file" in first["message"]
    if case == "bad plan":
        assert document["error"]["location"]["line"] == 4
    if case == "cannot fit":
        assert "fits" in document["error"]["message"] and document["fits"] is False


def test_doctor_json_prints_an_error_object_for_a_missing_run(tmp_path, capsys):
    assert main(["doctor", "--json", str(tmp_path / "no-run")]) == 1
    document = json.loads(capsys.readouterr().out)
    assert "is not a directory" in document["error"]["message"] and document["error"]["hint"]
    assert [e["message"] for e in document["error"]["errors"]] == [document["error"]["message"]]


def test_with_tp_pp_and_dp_fixed_dp_follows_tp_and_pp():
    # tp x pp x dp = 128 devices are all fixed: changing pp alone must change dp too, so dp is not
    # a key of its own in the search for the fewest changes, and is named when it changes.
    p = plan({"preset": "llama3-405b"}, nodes=16, gb=256, layout={"tp": 8, "pp": 16, "dp": 1, "recompute": "none"})
    assert fixed_keys(p) == ["tp", "pp", "recompute"]
    freed = _freed(p, ("pp",))
    assert (freed.layout.pp, freed.layout.dp, freed.layout.tp) == ("auto", "auto", 8)
    s = choose(p, load_registry()).suggestion
    assert s.layout is not None and all(getattr(s.layout, k) != dict(s.freed)[k] for k, _ in s.changed)
    if s.layout.pp != 16:
        assert ("dp", s.layout.dp) in s.changed


def test_a_cpu_plan_at_the_presets_placeholder_rates_has_no_band_and_says_how_to_get_one(tmp_path):
    """The published-run band is a GPU figure: the CPU matrix measured steps 2x-100x the cpu
    preset's predictions, and ~22% from them after `planc calibrate --cpu` (docs/accuracy.md)."""
    from planc.cost.uncertainty import CPU_CALIBRATED_RELATIVE
    from tests.calibrate.test_profile import plan_with, profile_dict

    raw = plan_with(tmp_path, None)  # the cpu preset, no profile
    choice = choose(raw, load_registry())
    d = to_dict(raw, choice)
    assert d["training"]["uncertainty"] is None and d["training"]["seconds_range"] is None
    assert d["uncertainty"]["step_time_relative"] is None and "planc calibrate --cpu" in d["uncertainty"]["basis"]
    text = render_text(raw, choice)
    assert "(uncalibrated) =" in text.split("step time")[1] and "MFU" in text and "(uncalibrated)" in text
    assert "uncalibrated: the 'cpu' preset's rates are placeholders" in text and "±9%" not in text
    # With a calibration of the machine: the CPU matrix's band.
    calibrated = plan_with(tmp_path, profile_dict())
    d = to_dict(calibrated, choose(calibrated, load_registry()))
    assert d["training"]["uncertainty"] == CPU_CALIBRATED_RELATIVE == d["uncertainty"]["step_time_relative"]
    assert f"±{CPU_CALIBRATED_RELATIVE:.0%}" in render_text(calibrated, choose(calibrated, load_registry()))


def test_links_are_called_by_their_medium():
    from planc.units import Quantity

    mi = plan({"preset": "gpt2"}, device="MI300X", nodes=2, gb=64)
    header = render_text(mi, choose(mi, load_registry())).splitlines()[2]
    assert "Infinity Fabric 448 GB/s per device" in header and "NVLink" not in header
    custom = build_plan(
        {
            "model": {"preset": "gpt2"},
            "hardware": {
                "device": "pcie-l40s",
                "nodes": 2,
                "per_node": 4,
                "memory": Quantity.of(48, "GiB"),
                "peak": Quantity.of(362, "TFLOPS"),
                "intra_node_bw": Quantity.of(32, "GB/s"),
                "inter_node_bw": Quantity.of(12.5, "GB/s"),
            },
            "train": {"global_batch": 64},
            "layout": {"tp": 1, "pp": 1},
        }
    )
    choice = choose(custom, load_registry())
    text = render_text(custom, choice)
    # the device's name says PCIe: so does explain, never NVLink nor a nameless "intra-node"
    assert "PCIe 32 GB/s per device" in text.splitlines()[2] and "nvlink" not in text.lower()
    assert "intra-node" not in text
    # dp 8 over 2 nodes: 4 x 12 = 48 GB/s of NICs per node (96% of 12.5 moved), but the ring's hops
    # inside a node run at 25.6 GB/s (80% of 32, the share a device no preset describes gets): the
    # group gets 25.6 GB/s per device, and says why
    dp = next(line for line in text.splitlines() if line.strip().startswith("DP "))
    assert dp.endswith(
        "network 25.6 GB/s per device (capped by PCIe: the ring's hops inside a node run "
        "at 25.6 GB/s, less than the node's 4 NICs × 12 GB/s = 48 GB/s)"
    )
    (comm,) = [c for c in to_dict(custom, choice)["comm"] if c["group"] == "dp"]
    assert (comm["medium"], comm["bandwidth_per"]) == ("network", "device")
    assert comm["bandwidth"] == pytest.approx(32e9 * 0.8)


def _link_header(device: str, **hardware) -> str:
    """Explain's hardware line for gpt2 on one node of ``device`` (a custom one gets L40S's numbers)."""
    custom = {"memory": Quantity.of(48, "GiB"), "peak": Quantity.of(362, "TFLOPS")}
    custom |= {"intra_node_bw": Quantity.of(32, "GB/s"), "inter_node_bw": Quantity.of(12.5, "GB/s")}
    hw = {"device": device, "per_node": 4, **({} if device in HARDWARE_PRESETS else custom), **hardware}
    p = build_plan({"model": {"preset": "gpt2"}, "hardware": hw, "train": {"global_batch": 64}})
    return render_text(p, choose(p, load_registry())).splitlines()[2]


def test_a_plan_names_its_own_node_link():
    # a custom device named for its chip: the plan says what links it, and explain repeats it
    assert "PCIe 32 GB/s per device" in _link_header("L40S", intra_node_link="PCIe")
    assert "intra-node 32 GB/s per device" in _link_header("L40S")  # nothing names the link
    # an A100-80GB written with PCIe's 32 GB/s is no NVLink machine: the preset's name is dropped
    pcie_a100 = _link_header("A100-80GB", intra_node_bw=Quantity.of(32, "GB/s"))
    assert "intra-node 32 GB/s per device" in pcie_a100 and "NVLink" not in pcie_a100
    named = _link_header("A100-80GB", intra_node_bw=Quantity.of(32, "GB/s"), intra_node_link="PCIe")
    assert "PCIe 32 GB/s per device" in named
    # the preset's own bandwidth, written out or not, keeps the preset's link
    assert "NVLink 300 GB/s per device" in _link_header("A100-80GB", intra_node_bw=Quantity.of(300, "GB/s"))
    assert "NVLink 300 GB/s per device" in _link_header("A100-80GB")


def test_a_pipeline_crossing_nodes_past_its_first_boundary_says_network():
    from planc.units import Quantity

    # TP 2 x PP 4 x DP 2 on 2 x 8: stages 0-1 on node 0, 2-3 on node 1 (tests/hardware/test_topology.py)
    p = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 8192},
            "hardware": {"device": "H100-SXM", "nodes": 2, "inter_node_bw": Quantity.of(1, "GB/s")},
            "train": {"global_batch": 64, "micro_batch": 1},
            "layout": {"tp": 2, "pp": 4, "dp": 2, "zero": 2, "schedule": "1f1b", "recompute": "none"},
        }
    )
    choice = choose(p, load_registry())
    row = next(line for line in render_text(p, choice).splitlines() if line.strip().startswith("PP "))
    assert row.endswith("network 0.96 GB/s per device")  # what NCCL moves of the NIC's 1 GB/s
    (comm,) = [c for c in to_dict(p, choice)["comm"] if c["group"] == "pp"]
    assert (comm["medium"], comm["bandwidth"]) == ("network", 0.96e9)


def test_model_states_alone_says_the_model_states_not_the_cuda_context():
    """The course's topic 1: Llama 3 8B on one A100 under AdamW keeps 16 B per parameter (fp32
    parameters 4 + gradients 4 + two moments 8): 8.03e9 x 16 B = 128.5e9 B = 119.66 GiB. The row
    says that, not 120.7 GiB (the bound with the 1 GiB CUDA context)."""
    p = plan({"preset": "llama3-8b", "seq_len": 4096}, device="A100-80GB", per_node=1, gb=64)
    choice = choose(p, load_registry())
    states = choice.estimate.memory.model_states_at_peak
    assert states == pytest.approx(p.model.params * 16)
    rows = [r for r in choice.rejected if r.limit is Limit.MODEL_STATES]
    assert rows
    for row in rows:
        assert "model states alone need 119.7 GiB per device" in rejection_reason(row), rejection_reason(row)
        assert row.memory_bytes == pytest.approx(states + GiB)  # the bound keeps the runtime's 1 GiB


def test_the_closest_layout_shown_when_nothing_fits_is_the_least_memory_hungry():
    """GPT-3 175B on 8 A100s, batch 127 (odd: dp = 1): every split's model states exceed 80 GiB.
    The layout shown as the least memory-hungry needs no more than any split's leanest layout
    (full recomputation, SP, micro-batch 1, 1F1B), each evaluated as a fixed plan."""
    registry = load_registry()
    p = plan({"preset": "gpt3-175b"}, device="A100-80GB", gb=127)
    choice = choose(p, registry)
    assert not choice.fits
    shown = choice.estimate.memory_bytes
    for tp, pp in [(8, 1), (4, 2), (2, 4), (1, 8)]:
        layout = {"tp": tp, "pp": pp, "dp": 1, "recompute": "full", "sequence_parallel": tp > 1}
        if pp > 1:
            layout["schedule"] = "1f1b"
        fixed = plan({"preset": "gpt3-175b"}, device="A100-80GB", gb=127, layout=layout, micro_batch=1)
        need = choose(fixed, registry).estimate.memory_bytes
        assert shown <= need, (tp, pp, need / GiB, shown / GiB)
    assert choice.suggestion.short_by_bytes == pytest.approx(shown - choice.estimate.capacity)


def _followed(raw, s):
    """The plan ``raw`` with suggestion ``s`` applied: its cluster, and any keys it names."""
    layout = {**raw.get("layout", {}), **dict(s.changed)}
    hardware = {**raw["hardware"], "nodes": s.nodes, "per_node": s.per_node}
    return build_plan({**raw, "hardware": hardware, "layout": layout})  # legal, or this raises


@pytest.mark.parametrize(
    "raw",
    [
        # The audit's case (a): tp = 1 and pp = 1 fixed; freeing tp on 16 devices fits, keeping it does not.
        {
            "model": {"preset": "llama2-7b"},
            "hardware": {"device": "A100-80GB", "per_node": 8, "memory": Quantity.of(12, "GiB")},
            "train": {"global_batch": 64},
            "layout": {"tp": 1, "pp": 1},
        },
        # Case (b): tp x pp x dp = 16 fixed pins the device count: no larger cluster keeps all three.
        # (70 GiB per device: with 80, TP 4 x DP 4 under ZeRO-3 fits the 16 devices, by 0.3 GiB.)
        {
            "model": {"preset": "llama3-70b", "seq_len": 4096},
            "hardware": {"device": "H100-SXM", "nodes": 2, "per_node": 8, "memory": Quantity.of(70, "GiB")},
            "train": {"global_batch": 64},
            "layout": {"tp": 4, "pp": 4, "dp": 1},
        },
    ],
)
def test_following_a_more_devices_suggestion_leads_to_a_plan_that_fits(raw):
    registry = load_registry()
    p = build_plan(raw)
    choice = choose(p, registry)
    s = choice.suggestion
    assert not choice.fits and s.nodes is not None, suggestion_text(s)
    followed = choose(_followed(raw, s), registry)
    assert followed.fits, suggestion_text(s)
    for key, value in raw["layout"].items():  # the keys it does not name stay as written
        if key not in dict(s.changed):
            assert getattr(followed.layout, key) == value, key
    text = suggestion_text(s)
    if s.changed:
        assert "no cluster tried fits the fixed layout keys" in text and " (not " in text
    else:
        assert "the plan as written" in text


def test_a_pinned_device_count_is_told_which_key_to_free():
    # tp 4 x pp 4 x dp 1 = 16 devices: on 32 one of them must change, and the text names it (70 GiB
    # per device: with 80, TP 4 x DP 4 under ZeRO-3 fits the 16 devices, by 0.3 GiB).
    p = build_plan(
        {
            "model": {"preset": "llama3-70b", "seq_len": 4096},
            "hardware": {"device": "H100-SXM", "nodes": 2, "per_node": 8, "memory": Quantity.of(70, "GiB")},
            "train": {"global_batch": 64},
            "layout": {"tp": 4, "pp": 4, "dp": 1},
        }
    )
    s = choose(p, load_registry()).suggestion
    assert s.changed and s.nodes * s.per_node > 16
    assert len(s.changed) == 1  # one key suffices: dp = 2 or pp = 8 on 32 devices


def test_an_all_reduce_in_the_nvswitch_says_so():
    """DDP inside one H100 node: its gradients' all-reduce is priced in the NVSwitch (NVLS, 275 GB/s of
    buffer), faster than a ring over 8 ranks at 369 GB/s (2 x 7/8 / 369 > 1 / 275), and the link says
    so; with 2 ranks the ring is faster (1 / 369 < 1 / 275) and nothing is said."""
    for dp, said in ((8, True), (2, False)):
        p = plan({"preset": "gpt2"}, per_node=dp, gb=64, layout={"tp": 1, "pp": 1, "zero": 0})
        text = render_text(p, choose(p, load_registry()))
        row = next(line for line in text.splitlines() if line.strip().startswith("DP "))
        assert ("all-reduces in the NVSwitch (NVLS) at 275 GB/s of buffer" in row) is said, row
