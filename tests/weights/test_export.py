"""`planc export` in one process (a checkpoint written here with DCP, no torchrun), and its errors.

The multi-process round trip (checkpoints sharded by TP and PP) is test_train_export_import.py.
"""

import json

import pytest
import torch

from planc.cli import main
from planc.runtime.checkpoint_write import save_checkpoint
from planc.runtime.optim import build_lr_scheduler, build_optimizer
from planc.runtime.transformer import build_model, init_weights
from planc.spec import build_plan
from planc.weights.import_hf import load_pretrained

transformers = pytest.importorskip("transformers")

NEOX_SHAPED = dict(mlp="gelu", norm="layernorm", position="rope", rope_theta=300.0)


def _run_dir(tmp_path, steps=(2,), **model):
    """A run directory as `planc run` leaves it: plan.json and DCP checkpoints at ``steps``."""
    keys = dict(layers=2, hidden=32, heads=4, vocab=90, vocab_multiple=32, seq_len=16, **model)
    raw = {
        "model": keys,
        "hardware": {"device": "cpu", "per_node": 1},
        "train": {"global_batch": 2, "precision": "fp32"},
        "checkpoint": {"every": 1},
    }
    plan = build_plan(raw)
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"plan": plan.model_dump(mode="json"), "layout": {}}))
    model = build_model(plan.model)
    init_weights(model, seed=5)
    with torch.no_grad():  # trained-looking weights: large enough that layouts matter
        for param in model.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())))
    optimizer = build_optimizer(model.parameters(), plan.train)
    for step in steps:
        save_checkpoint(run / "checkpoints", step, [model], [optimizer], [build_lr_scheduler(optimizer, plan.train)])
    return run, plan, model.eval()


def _logits(model, vocab=90):
    tokens = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(tokens)
    return out.logits if hasattr(out, "logits") else out[..., :vocab]


def test_sharded_neox_export_loads_in_transformers_and_back_into_planc(tmp_path, capsys):
    run, plan, model = _run_dir(tmp_path, **NEOX_SHAPED)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--to", str(out), "--max-shard-size", "20KB"]) == 0
    assert "exported step 2" in capsys.readouterr().out
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and set(index["weight_map"].values()) == set(shards)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt_neox" and config["use_parallel_residual"] is False

    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    expected = _logits(model)
    assert (_logits(theirs) - expected).abs().max() < 1e-4

    back = build_plan(
        {
            "model": {"from": str(out), "init": "pretrained", "vocab_multiple": 32},
            "hardware": {"device": "cpu", "per_node": 1},
            "train": {"global_batch": 1},
        }
    ).model
    again = build_model(back)
    load_pretrained(again, back)
    assert (_logits(again.eval()) - expected).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("keys", "hf_class"),
    [
        (dict(mlp="swiglu", norm="rmsnorm", position="rope", kv_heads=2), "LlamaForCausalLM"),
        (dict(mlp="swiglu", norm="rmsnorm", position="rope", kv_heads=2, qkv_bias=True), "Qwen2ForCausalLM"),
        (dict(mlp="swiglu", norm="rmsnorm", position="rope", bias=True, tie_embeddings=True), "LlamaForCausalLM"),
        (dict(mlp="gelu", norm="layernorm", position="learned", bias=False), "GPT2LMHeadModel"),
    ],
)
def test_each_family_exports_to_its_transformers_class(tmp_path, keys, hf_class):
    """Including biases the family has and the model lacks (GPT-2 without biases: zeros)."""
    run, _, model = _run_dir(tmp_path, **keys)
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == hf_class
    assert (_logits(theirs) - _logits(model)).abs().max() < 1e-4


def test_torch_format_is_the_state_dict_and_loads_weights_only(tmp_path):
    run, plan, model = _run_dir(tmp_path, tie_embeddings=True)
    assert main(["export", str(run), "--to", str(tmp_path / "pt"), "--format", "torch", "--dtype", "bf16"]) == 0
    state = torch.load(tmp_path / "pt" / "model.pt", weights_only=True)
    assert set(state) == set(model.state_dict())
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    assert state["output.weight"].data_ptr() == state["tok_embeddings.weight"].data_ptr()  # tied: stored once
    fresh = build_model(plan.model)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.layers["1"].attention.wq.weight, model.layers["1"].attention.wq.weight.bfloat16().float())
    assert json.loads((tmp_path / "pt" / "plan.json").read_text())["model"]["tie_embeddings"] is True


def test_the_export_directory_is_created_with_its_parents(tmp_path):
    # docs/getting-started.md writes `--to exported/tiny` before exported/ exists, as `mkdir -p`
    run, _, _ = _run_dir(tmp_path)
    to = tmp_path / "exported" / "tiny"
    assert main(["export", str(run), "--to", str(to), "--format", "torch"]) == 0
    assert (to / "model.pt").is_file()


def test_export_errors_say_what_to_do(tmp_path, capsys):
    run, _, _ = _run_dir(tmp_path, steps=(1, 2))

    def error(*argv):
        assert main(["export", *argv]) == 1
        return capsys.readouterr().err

    assert "run directory not found" in error(str(tmp_path / "nope"), "--to", str(tmp_path / "x"))
    assert "no plan.json" in error(str(tmp_path), "--to", str(tmp_path / "x"))
    message = error(str(run), "--to", str(tmp_path / "x"), "--step", "7")
    assert "no checkpoint of step 7" in message and "steps 1, 2" in message
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert "not empty" in error(str(run), "--to", str(tmp_path / "full"))
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"  # nothing lost
    assert "is not a size" in error(str(run), "--to", str(tmp_path / "x"), "--max-shard-size", "5 GB/s")
    assert not (tmp_path / "x").exists()


def test_a_model_no_hugging_face_class_computes_is_refused_with_the_way_out(tmp_path, capsys):
    run, _, _ = _run_dir(tmp_path, mlp="gelu", norm="rmsnorm", position="rope")
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "no Hugging Face architecture" in err and "norm = rmsnorm" in err and "--format torch" in err
    assert main(["export", str(run), "--to", str(tmp_path / "pt"), "--format", "torch"]) == 0


def test_a_run_without_checkpoints(tmp_path, capsys):
    run, plan, _ = _run_dir(tmp_path)
    record = json.loads((run / "plan.json").read_text())
    record["plan"]["checkpoint"] = None
    (run / "plan.json").write_text(json.dumps(record))
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 1
    assert "checkpoint { every = 100 }" in capsys.readouterr().err


@pytest.mark.parametrize(
    "umask, directory_mode, file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)], ids=["022", "027"]
)
def test_an_export_is_as_readable_as_the_umask_says(tmp_path, umask, directory_mode, file_mode):
    """mkdtemp's staging directory is 0700 and safetensors writes 0600: after the rename, the export must
    have the modes mkdir and open give under the umask (0o777 & ~umask, 0o666 & ~umask), as config.json has."""
    import os
    import stat

    run, _, _ = _run_dir(tmp_path)
    old = os.umask(umask)
    try:
        assert main(["export", str(run), "--to", str(tmp_path / "hf"), "--max-shard-size", "20KB"]) == 0
        assert main(["export", str(run), "--to", str(tmp_path / "pt"), "--format", "torch"]) == 0
    finally:
        os.umask(old)
    for out in (tmp_path / "hf", tmp_path / "pt"):
        assert stat.S_IMODE(out.stat().st_mode) == directory_mode
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
        assert len(modes) >= 2 and set(modes.values()) == {file_mode}, modes


def test_exporting_a_checkpoint_older_than_the_logged_steps_warns(tmp_path, capsys):
    """The last saves failed (a full disk): the newest checkpoint is step 2 but metrics.jsonl reached step 5."""
    run, _, _ = _run_dir(tmp_path, steps=(2,))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 6)))
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr()
    assert "exported step 2 of" in out.out
    assert f"warning: the newest checkpoint of {run} is step 2, but training logged step 5" in out.err
    assert "lacks the last 3 step(s)" in out.err
    assert main(["export", str(run), "--to", str(tmp_path / "hf2"), "--step", "2"]) == 0  # asked for: no warning
    assert "warning" not in capsys.readouterr().err


def _largest_item(checkpoint, prefix):
    """(offset, length) of the largest DCP item of __0_0.distcp whose key starts with ``prefix``."""
    from planc.runtime.checkpoint import SafeFileSystemReader

    storage = SafeFileSystemReader(checkpoint).read_metadata().storage_data
    spans = [(i.length, i.offset) for k, i in storage.items() if k.fqn.startswith(prefix)]
    length, offset = max(spans)
    return offset, length


def _flip_a_byte(checkpoint, prefix="model."):
    """One changed byte in the middle of the largest weight (or of ``prefix``'s largest item: "optim."),
    size unchanged: DCP itself would load it silently."""
    shard = checkpoint / "__0_0.distcp"
    offset, length = _largest_item(checkpoint, prefix)
    data = bytearray(shard.read_bytes())
    data[offset + length // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_with_the_older_step_to_export(tmp_path, capsys):
    """The export checks the manifest as a resume does: a corrupted shard is named, and --step offers the
    newest older checkpoint (step 2 of 1, 2, 3), which then exports."""
    run, _, _ = _run_dir(tmp_path, steps=(1, 2, 3))
    _flip_a_byte(run / "checkpoints" / "step-00000003")
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert f"the checkpoint {run / 'checkpoints' / 'step-00000003'} is damaged" in err
    assert "the model's weights in __0_0.distcp do not match their SHA-256 in the manifest (corrupted)" in err
    assert "--step 2" in err and f"planc doctor --verify {run}" in err
    assert not (tmp_path / "hf").exists()  # nothing written
    assert main(["export", str(run), "--to", str(tmp_path / "pt"), "--step", "3", "--format", "torch"]) == 1
    assert "is damaged" in capsys.readouterr().err
    assert main(["export", str(run), "--to", str(tmp_path / "hf"), "--step", "2"]) == 0


def test_a_weight_damaged_where_dcp_itself_fails_is_reported_as_damage(tmp_path, capsys):
    """A changed first byte of a weight's item breaks the serialized tensor DCP reads (its zip header),
    so the load fails before the weights' check could run: the failure is reported as the damage."""
    run, _, _ = _run_dir(tmp_path, steps=(2,))
    checkpoint = run / "checkpoints" / "step-00000002"
    shard = checkpoint / "__0_0.distcp"
    offset, _ = _largest_item(checkpoint, "model.")
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "the model's weights in __0_0.distcp do not match their SHA-256 in the manifest (corrupted)" in err
    assert "Traceback" not in err and not (tmp_path / "hf").exists()


def test_a_damaged_only_checkpoint_says_there_is_no_older_one(tmp_path, capsys):
    run, _, _ = _run_dir(tmp_path, steps=(2,))
    (run / "checkpoints" / "step-00000002" / "__0_0.distcp").unlink()
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "is damaged: __0_0.distcp is missing" in err and "no older one" in err


def test_the_export_reads_the_weights_once_and_the_optimizer_state_never(tmp_path, monkeypatch):
    """The export hashed every file of the checkpoint before loading the weights from it: the whole
    checkpoint read once more, optimizer state included (twice the weights under Adam). It now checks
    the manifest's model_sha256 from the bytes DCP loads: a changed byte of optimizer state, which
    the export does not read, no longer stops it, and the weights it writes are the trained ones."""
    from planc.runtime.checkpoint import SafeFileSystemReader

    run, plan, model = _run_dir(tmp_path, steps=(2,))
    checkpoint = run / "checkpoints" / "step-00000002"
    _flip_a_byte(checkpoint, "optim.")
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    from planc.weights import checked_read

    read = []  # every byte range of __0_0.distcp read: by DCP through the reader, or by the check itself
    slice_file = checked_read.CheckedReader._slice_file
    monkeypatch.setattr(
        checked_read.CheckedReader,
        "_slice_file",
        lambda self, f, info: read.append((info.offset, info.length)) or slice_file(self, f, info),
    )
    assert main(["export", str(run), "--to", str(tmp_path / "pt"), "--format", "torch"]) == 0
    state = torch.load(tmp_path / "pt" / "model.pt", weights_only=True)
    assert all(torch.equal(state[name], value) for name, value in model.state_dict().items())
    storage = SafeFileSystemReader(checkpoint).read_metadata().storage_data
    weights = {(i.offset, i.length) for k, i in storage.items() if k.fqn.startswith("model.")}
    assert sorted(read) == sorted(weights)  # each weight item once, nothing of the optimizer's


def test_a_checkpoint_saved_before_model_sha256_is_checked_whole(tmp_path, capsys):
    """A manifest without model_sha256 (planc before it) gets the whole-file check, as before: a changed
    byte of optimizer state refuses the export."""
    run, _, _ = _run_dir(tmp_path, steps=(2,))
    checkpoint = run / "checkpoints" / "step-00000002"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for entry in manifest["files"].values():
        entry.pop("model_sha256", None)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    _flip_a_byte(checkpoint, "optim.")
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 1
    assert "__0_0.distcp does not match its SHA-256 in the manifest (corrupted)" in capsys.readouterr().err
