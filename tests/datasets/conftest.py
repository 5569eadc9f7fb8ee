"""A tiny tokenizer and token files, built here from tests/data/corpus (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_tokenizer import CORPUS, train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def prepared(tokenizer_file, tmp_path_factory) -> Path:
    """``planc prepare`` of the whole corpus with a 10% validation split: DIR/train.bin, DIR/val.bin."""
    from planc.data.prepare import Options, prepare

    out = tmp_path_factory.mktemp("tokens")
    prepare(Options(inputs=(CORPUS,), tokenizer=tokenizer_file, out=out, val_fraction=0.1))
    return out
