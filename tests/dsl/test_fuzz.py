"""Fuzzing ``planc check``: mutated example plans and random bytes must give exit 0 (still a
valid plan) or 1 with a located message or an ``error:`` line — never a traceback, never the
CLI's "internal error" (exit 2).

The default run is quick; ``PLANC_FUZZ_EXAMPLES=N`` scales every count (N hypothesis examples,
10 N plain random mutations, 2 N random byte files). Each test prints what it tried and found
(``pytest -s`` shows it).
"""

import os
import random
import re
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planc.dsl.syntax_scan import scan

from .helpers import EXAMPLE_PLANS, run_cli

N = int(os.environ.get("PLANC_FUZZ_EXAMPLES", "150"))
SEEDS = [path.read_text() for path in EXAMPLE_PLANS]
#: Fragments that tend to break things: structure, literals, keywords, odd characters.
POOL = [
    "{",
    "}",
    "[",
    "]",
    "=",
    ",",
    '"',
    "#",
    "\n",
    " ",
    "\t",
    "model",
    "use",
    "from",
    "auto",
    "true",
    "-",
    "+",
    ".",
    "1e3",
    "1e999",
    "80 GiB",
    "80 GIB",
    "2h",
    "x",
    "\\",
    "\\u00",
    "é",
    "\x00",
    "\x0c",
    "\u2028",
    "1f1b",
    "tp",
    "layers",
    "hardware",
    "use fsdp",
    '"a"',
    "0",
    "-1",
    "[1, 2]",
    "'",
    ":",
    ";",
    "model from",
    '"/dev/zero"',
    "preset",
    '"gpt2"',
    "= [",
    "\r",
    "1_",
    "_1",
    "0x10",
    "nan",
    "inf",
]
LOCATED = re.compile(r"^\S.*:\d+:\d+: error: ", re.MULTILINE)


def check_text(tmp_path, capsys, data: str | bytes, outcomes: Counter) -> None:
    path = tmp_path / "fuzz.plan"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_bytes(data.encode("utf-8", "surrogatepass"))
    code, out, err = run_cli(capsys, "check", str(path))
    assert code in (0, 1), f"exit {code} for {data!r}:\n{err}"
    assert "Traceback" not in err and "internal error" not in err, f"{data!r}:\n{err}"
    if code == 1:
        assert LOCATED.search(err) or err.startswith("error: "), f"unlocated message for {data!r}:\n{err}"
        outcomes["rejected with a message"] += 1
        outcomes["... with file:line:col" if LOCATED.search(err) else "... with an error: line"] += 1
    else:
        assert ": ok — " in out
        outcomes["still valid"] += 1


def mutate(text: str, ops: list[tuple[str, int, int, str]]) -> str:
    """Apply character- and token-level edits; positions wrap around the current text."""
    for op, a, b, fragment in ops:
        if op.startswith("token"):
            tokens = scan(text)
            if not tokens:
                op = "insert"
            else:
                first, second = tokens[a % len(tokens)], tokens[b % len(tokens)]
                start, end = first.offset, first.offset + len(first.text)
                if op == "token-delete":
                    text = text[:start] + text[end:]
                elif op == "token-duplicate":
                    text = text[:end] + " " + first.text + text[end:]
                elif op == "token-replace":
                    text = text[:start] + fragment + text[end:]
                elif op == "token-swap" and first.offset < second.offset:
                    s2, e2 = second.offset, second.offset + len(second.text)
                    text = text[:start] + second.text + text[end:s2] + first.text + text[e2:]
                continue
        n = len(text) + 1
        i, j = sorted((a % n, b % n))
        if op == "insert":
            text = text[:i] + fragment + text[i:]
        elif op == "delete":
            text = text[:i] + text[i : min(j, i + 8)]
        elif op == "swap" and i < j < n - 1:
            text = text[:i] + text[j] + text[i + 1 : j] + text[i] + text[j + 1 :]
        elif op == "truncate":
            text = text[:i]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
    return text


OPS = [
    "insert",
    "delete",
    "swap",
    "truncate",
    "duplicate",
    "token-delete",
    "token-duplicate",
    "token-replace",
    "token-swap",
]
fragments = st.one_of(st.sampled_from(POOL), st.text(max_size=3))
ops = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 10**6), st.integers(0, 10**6), fragments), min_size=1, max_size=6
)


@settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.sampled_from(SEEDS), edits=ops)
def test_hypothesis_mutations_of_the_examples(tmp_path, capsys, seed, edits):
    check_text(tmp_path, capsys, mutate(seed, edits), Counter())


@pytest.mark.dist(launches=False)  # as slow as a launch: the slow half of the suite
def test_random_mutations_of_the_examples(tmp_path, capsys):
    rng = random.Random(20240611)
    outcomes: Counter = Counter()
    tries = 10 * N
    for _ in range(tries):
        edits = [
            (
                rng.choice(OPS),
                rng.randrange(10**6),
                rng.randrange(10**6),
                rng.choice(POOL) if rng.random() < 0.8 else chr(rng.randrange(1, 0x3000)),
            )
            for _ in range(rng.randint(1, 8))
        ]
        check_text(tmp_path, capsys, mutate(rng.choice(SEEDS), edits), outcomes)
    with capsys.disabled():
        print(f"\nfuzz: {tries} random mutations of {len(SEEDS)} example plans: {dict(outcomes)}")
    assert sum(outcomes[k] for k in ("rejected with a message", "still valid")) == tries
    assert outcomes["rejected with a message"] > tries // 2  # the mutations do break plans


def test_random_bytes(tmp_path, capsys):
    rng = random.Random(7)
    outcomes: Counter = Counter()
    tries = 2 * N
    for index in range(tries):
        size = rng.choice([0, 1, 2, 10, 100, 1000, 5000])
        data = rng.randbytes(size)
        if index % 2:  # half of them: printable ASCII junk, which gets past the UTF-8 and NUL checks
            data = bytes(rng.choice(b' \n\t{}[]=,"#abcxyz019-._') for _ in range(size))
        check_text(tmp_path, capsys, data, outcomes)
    with capsys.disabled():
        print(f"\nfuzz: {tries} random byte files: {dict(outcomes)}")
    assert outcomes["still valid"] == 0


@pytest.mark.dist
def test_a_few_runs_as_a_subprocess(tmp_path):
    rng = random.Random(3)
    inputs = [
        rng.randbytes(300),
        mutate(SEEDS[0], [("token-delete", 7, 0, ""), ("insert", 40, 0, "[[")]),
        SEEDS[0][: len(SEEDS[0]) // 2],
    ]
    for index, data in enumerate(inputs):
        path = tmp_path / f"case{index}.plan"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        result = subprocess.run(
            [sys.executable, "-m", "planc", "check", str(path)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr
        assert LOCATED.search(result.stderr) or result.stderr.startswith("error: ")
