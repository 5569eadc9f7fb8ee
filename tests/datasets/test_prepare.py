"""planc prepare: the ids are the tokenizer's own, documents end with the separator, the split is held out."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from corpus_tokenizer import CORPUS, EOS, VOCAB

from planc.cli import main
from planc.data.prepare import Options, PrepareError, ValSchedule, prepare
from planc.data.progress import Progress
from planc.data.token_files import open_token_file


def ids_of(path) -> list[int]:
    return open_token_file(path).array().tolist()


def test_json_lines_become_the_tokenizers_ids_with_a_separator_after_each_document(tokenizer_file, tmp_path):
    from tokenizers import Tokenizer

    records = [json.loads(line) for line in (CORPUS / "docs.jsonl").read_text().splitlines()]
    prepare(Options(inputs=(CORPUS / "docs.jsonl",), tokenizer=tokenizer_file, out=tmp_path, val_fraction=0))
    # The reference: the tokenizers library itself, one document at a time, then the separator.
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    expected = [i for r in records for i in tokenizer.encode(r["text"], add_special_tokens=False).ids + [eos]]
    assert ids_of(tmp_path / "train.bin") == expected
    sidecar = json.loads((tmp_path / "train.bin.json").read_text())
    assert sidecar["dtype"] == "uint16" and sidecar["vocab_size"] == VOCAB and sidecar["tokens"] == len(expected)
    assert sidecar["max_id"] == max(expected) and sidecar["documents"] == len(records) and sidecar["eos_id"] == eos
    assert not (tmp_path / "val.bin").exists()


def test_plain_text_round_trips_through_the_byte_level_tokenizer(tokenizer_file, tmp_path):
    from tokenizers import Tokenizer

    source = CORPUS / "planner.txt"  # ~20 KB: three pieces of ~8 KiB, one document
    prepare(Options(inputs=(source,), tokenizer=tokenizer_file, out=tmp_path, val_fraction=0))
    ids = ids_of(tmp_path / "train.bin")
    eos = Tokenizer.from_file(str(tokenizer_file)).token_to_id(EOS)
    assert ids[-1] == eos and eos not in ids[:-1]  # one document: one separator, at its end
    # Byte-level BPE is lossless, so decoding the ids gives the file back, piece joins included.
    assert Tokenizer.from_file(str(tokenizer_file)).decode(ids[:-1]) == source.read_text()


def test_the_split_holds_out_about_the_fraction_and_loses_nothing(tokenizer_file, prepared, tmp_path):
    whole = tmp_path / "whole"
    prepare(Options(inputs=(CORPUS,), tokenizer=tokenizer_file, out=whole, val_fraction=0))
    train, val, everything = ids_of(prepared / "train.bin"), ids_of(prepared / "val.bin"), ids_of(whole / "train.bin")
    assert len(train) + len(val) == len(everything)  # every token lands in exactly one split
    assert sorted(train + val) == sorted(everything)
    assert 0.03 < len(val) / len(everything) < 0.3  # 10% of the pieces (within one piece, pieces vary in size)
    for name in ("train", "val"):
        sidecar = json.loads((prepared / f"{name}.bin.json").read_text())
        assert sidecar["split"] == name and sidecar["tokens"] == len(ids_of(prepared / f"{name}.bin"))


def test_systematic_split_takes_every_kth_piece():
    schedule = ValSchedule(0.25, seed=5)
    held_out = [i for i in range(40) if schedule.next_is_val()]
    assert len(held_out) == 10  # 40 pieces x 0.25
    assert len({b - a for a, b in zip(held_out, held_out[1:])}) == 1  # evenly spaced: every 4th


@pytest.mark.dist  # two workers are two processes
def test_workers_do_not_change_the_output(tokenizer_file, tmp_path, monkeypatch):
    import planc.data.prepare

    monkeypatch.setattr(planc.data.prepare, "BATCH_BYTES", 16 * 1024)  # ~7 batches, so both workers get some
    one, two = tmp_path / "one", tmp_path / "two"
    for out, workers in ((one, 1), (two, 2)):
        prepare(Options(inputs=(CORPUS,), tokenizer=tokenizer_file, out=out, val_fraction=0.1, workers=workers))
    for name in ("train.bin", "val.bin"):
        assert (one / name).read_bytes() == (two / name).read_bytes()


def test_bad_inputs_are_named_with_their_line(tokenizer_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"body": "no text key"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: no 'text' field \(it has 'body'\); .*--text-key"):
        prepare(Options(inputs=(bad,), tokenizer=tokenizer_file, out=tmp_path / "o"))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin.txt: not UTF-8 text"):
        prepare(Options(inputs=(latin,), tokenizer=tokenizer_file, out=tmp_path / "o"))
    assert not list((tmp_path / "o").glob("*.bin*"))  # nothing half-written is left behind


def test_an_empty_validation_split_and_an_existing_output_are_refused(tokenizer_file, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("one small document\n")
    with pytest.raises(PrepareError, match="validation split is empty.*--val-fraction"):
        prepare(Options(inputs=(short,), tokenizer=tokenizer_file, out=tmp_path / "o", val_fraction=0.01))
    prepare(Options(inputs=(short,), tokenizer=tokenizer_file, out=tmp_path / "o", val_fraction=0))
    with pytest.raises(PrepareError, match="train.bin exists; .*--force"):
        prepare(Options(inputs=(short,), tokenizer=tokenizer_file, out=tmp_path / "o", val_fraction=0))


def test_the_separator_is_found_named_or_refused(tokenizer_file, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    none = prepare(Options(inputs=(text,), tokenizer=tokenizer_file, out=tmp_path / "a", val_fraction=0, eos="none"))
    assert none.eos_id is None and len(ids_of(tmp_path / "a" / "train.bin")) == none.written["train"].tokens
    with pytest.raises(PrepareError, match="no token '</s>'"):
        prepare(Options(inputs=(text,), tokenizer=tokenizer_file, out=tmp_path / "b", eos="</s>"))


def test_cli_writes_the_files_and_draws_no_bar_off_a_terminal(tokenizer_file, tmp_path, capsys):
    code = main(
        ["prepare", str(CORPUS), "--tokenizer", str(tokenizer_file), "--out", str(tmp_path), "--workers", "1"]
        + ["--val-fraction", "0.1"]
    )
    out, err = capsys.readouterr()
    assert code == 0 and (tmp_path / "train.bin").is_file() and (tmp_path / "val.bin.json").is_file()
    assert "wrote" in out and "\r" not in err and 'val_data = "' in err
    assert main(["prepare", str(tmp_path / "missing.txt"), "--tokenizer", str(tokenizer_file), "--out", "x"]) == 1
    assert "no such file or directory" in capsys.readouterr().err


def test_progress_bar_draws_on_a_terminal():
    stream = io.StringIO()
    progress = Progress("prepare", 2_000_000, stream=stream, enabled=True)
    progress.update(1_000_000, 250_000)
    progress.close()
    assert stream.getvalue().startswith("\rprepare  50% |" + "#" * 12)
    assert "1.0/2.0 MB" in stream.getvalue() and "0.25 M tokens" in stream.getvalue()
    assert np.isclose(progress.done_bytes, 1e6)
