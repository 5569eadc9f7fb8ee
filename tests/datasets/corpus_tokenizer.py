"""The test corpus and a tiny tokenizer trained on it (nothing is downloaded); the fixtures are in conftest.py.

A module of its own, not conftest: ``from conftest import ...`` finds whichever conftest.py was
imported last when several test folders are collected together."""

from __future__ import annotations

from pathlib import Path

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
