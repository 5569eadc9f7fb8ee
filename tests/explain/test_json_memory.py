"""``planc explain --json``'s memory rows rebuild the text table: every row the table shows, each
flagged with whether the stage's peak holds it, and the at-peak rows sum to the group totals."""

import json

import pytest

from planc.cli import main
from planc.spec import build_plan

DDP = {  # bf16 DDP: the logits' "forward" and a block backward's "backward" terms are not at the "loss" peak
    "model": {"preset": "gpt2", "seq_len": 1024},
    "hardware": {"device": "A100-80GB", "nodes": 1},
    "train": {"global_batch": 480, "micro_batch": 20},
    "layout": {"tp": 1, "pp": 1, "dp": 8, "zero": 0},
}
FSDP = {
    "model": {"preset": "llama2-7b"},
    "hardware": {"device": "A100-80GB", "nodes": 1},
    "train": {"global_batch": 64, "micro_batch": 1, "precision": "bf16"},
    "layout": {"tp": 1, "pp": 1, "dp": 8, "zero": 3},
}
PIPELINE = {
    "model": {"preset": "llama2-13b", "seq_len": 2048},
    "hardware": {"device": "A100-40GB", "nodes": 2},
    "train": {"global_batch": 64},
    "layout": {"pp": 4, "tp": 2, "schedule": "1f1b"},
}


def _explain(tmp_path, capsys, name, raw):
    path = tmp_path / f"{name}.json"
    path.write_text(build_plan(raw, source=name).to_json())
    assert main(["explain", str(path)]) == 0
    text = capsys.readouterr().out
    assert main(["explain", str(path), "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)["memory"]


@pytest.mark.parametrize("name, raw", [("ddp", DDP), ("fsdp", FSDP), ("pipeline", PIPELINE)])
def test_the_at_peak_rows_sum_to_the_totals(tmp_path, capsys, name, raw):
    text, m = _explain(tmp_path, capsys, name, raw)
    for terms, total in (("activation_terms", "activations_bytes"), ("transient_terms", "transient_bytes")):
        rows = m[terms]
        assert all(set(r) == {"name", "bytes", "phases", "at_peak"} for r in rows)
        assert sum(r["bytes"] for r in rows if r["at_peak"]) == pytest.approx(m[total]), terms
        for r in rows:
            # A row held throughout is at every peak; a row of phases without the peak's is not.
            assert r["at_peak"] == (not r["phases"] or m["peak_phase"] in r["phases"]), r
            if r["bytes"]:
                assert r["name"] in text, r["name"]  # the same rows as the text table
    blocks = m["activation_terms"][0]
    assert blocks["name"].startswith("blocks (") and blocks["bytes"] > 0 and blocks["at_peak"]
    states = m["params_bytes"] + m["master_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]
    assert states + m["activations_bytes"] + m["transient_bytes"] == pytest.approx(m["total_bytes"])


def test_rows_held_in_another_phase_are_flagged_not_dropped(tmp_path, capsys):
    """gpt2 under bf16 DDP peaks in the loss phase: the logits as the head writes them (forward
    phase) are listed, flagged not at the peak, as the table's "not at the peak" section lists them."""
    text, m = _explain(tmp_path, capsys, "ddp", DDP)
    assert m["peak_phase"] == "loss"
    elsewhere = [r for r in m["activation_terms"] + m["transient_terms"] if not r["at_peak"]]
    assert elsewhere and all("loss" not in r["phases"] for r in elsewhere)
    section = text.split("not at the peak", 1)[1]
    assert all(r["name"] in section for r in elsewhere)
