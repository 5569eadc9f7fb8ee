"""A tiny tokenizer and token files, built here from tests/data/corpus (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
#: A byte-level BPE of this size trains in ~0.1 s on the corpus and needs uint16 ids.
VOCAB = 512
EOS = "<|endoftext|>"


def train_tokenizer(path: Path, vocab: int = VOCAB) -> Path:
    """A GPT-2-style byte-level BPE trained on two corpus files, saved as a tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(CORPUS / "cost-model.txt"), str(CORPUS / "planner.txt")], trainer)
    tokenizer.save(str(path))
    return path


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
