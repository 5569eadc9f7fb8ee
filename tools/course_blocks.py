"""The generated blocks of docs/course/: planc's own output, abridged by a rule in the marker.

A block is everything between ``<!-- planc:begin KIND ARGS -->`` and ``<!-- planc:end -->``;
``python tools/refresh_docs.py`` rewrites it, ``tests/test_course_current.py`` fails when one is
stale. ARGS are shell words; ``key=value`` words are options of the block, ``--flags`` go to
``planc explain`` as they are. Kinds:

``plan PLAN``
    the plan file's text.
``explain PLAN [keep=S1,S2] [grep=REGEX] [set=block.key=value ...] [--explain-flags]``
    ``planc explain``'s text. ``keep`` keeps only the named sections (the blank-line-separated
    parts of the output, named by their first word: header, chosen/layout (closest when nothing fits), memory, step,
    throughput, why, alternatives, pipeline); ``grep`` keeps only the lines matching REGEX
    (after ``keep``). ``set`` changes one key of the plan before planning (see ``with_setting``).
``try PLAN [set=...] change=block.key=value [keep=...] [grep=...] [--explain-flags]``
    the lines of ``planc explain`` that the change alters: ``-`` the plan (with its ``set``s),
    ``+`` with the ``change``s as well.
``source PATH from=REGEX to=REGEX``
    the lines of a file of planc (its code, say) from the first line matching ``from`` to the
    next matching ``to``.
``table PLAN vary=block.key:v1,v2,... col=LABEL:json.path[:unit] ...``
    one row per value (several ``vary`` zip together), one column per ``col`` from
    ``planc explain --json`` (``comm.dp.volume_bytes``: the ``comm`` list is keyed by group).
``collectives PLAN sizes=MiB,... groups=p,... [stride=k] [set=...]``
    planc's alpha-beta all-reduce time (ring and tree) on the plan's hardware, for groups of
    ranks 0, k, 2k, ... (k = 1: the first p ranks, filling a node first).
``<!-- planc:num PLAN json.path[:unit] [set=...] -->VALUE<!-- /planc -->``
    one number of ``planc explain --json`` inside a sentence, so the prose stays current too.
``run [fresh=runs/DIR] [drop=REGEX] -- COMMAND``
    the output of a real command line (``planc run``, ``planc doctor``), run by bash at the
    repository root after removing the ``fresh`` run directories; refreshed only by
    ``refresh_docs.py --runs`` (slow, and nondeterministic), stored with timings, pids, ports,
    clock times and host names masked as ``_`` and torch's own timestamped log lines left out.
    The staleness test checks only that the plans it names still parse.

Timings of the search itself ("scored in 0.2 s") are dropped from every output: they vary run to run.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- planc:begin (.*?) -->\n)(.*?)(<!-- planc:end -->)", re.S)
NUMBER = re.compile(r"(<!-- planc:num (.*?) -->)(.*?)(<!-- /planc -->)")
SEARCH_TIME = re.compile(r" in [0-9.]+ s(?= ·)")
_cache: dict[tuple, tuple[str, str]] = {}


def with_setting(text: str, setting: str) -> str:
    """The plan ``text`` with ``block.key = value`` set: the key's line replaced (or added at the
    top of its block), a missing block appended. Textual, so comments elsewhere survive."""
    target, _, value = setting.partition("=")
    block, _, key = target.partition(".")
    if not (block and key and value):
        raise ValueError(f"set={setting!r}: expected block.key=value")
    opening = re.search(rf"^{block}\b[^{{\n]*\{{[ \t]*(#.*)?\n", text, re.M)
    line = f"  {key} = {value}  # changed by the course's 'try this'\n"
    if opening is None:
        return text.rstrip("\n") + f"\n\n{block} {{\n{line}}}\n"
    body_end = text.index("\n}", opening.end() - 1)
    key_line = re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*=.*\n", re.M)
    found = key_line.search(text, opening.end(), body_end + 1)
    if found:
        return text[: found.start()] + line + text[found.end() :]
    return text[: opening.end()] + line + text[opening.end() :]


def planc_output(argv: list[str]) -> tuple[str, str]:
    """Stdout and stderr of ``planc ARGV``, run in this process, blind to this machine's verify
    results: ``explain`` shows a "measured" block for a plan someone verified here
    (``~/.cache/planc/verify``), and generated docs must not depend on who ran what."""
    from planc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as no_results, mock.patch.dict(os.environ, PLANC_VERIFY_DIR=no_results):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    return out.getvalue(), err.getvalue()


def _explained(plan: str, settings: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, str]:
    """``planc explain`` of ``plan`` with ``settings`` applied, cached per plan, settings, flags."""
    key = (plan, settings, flags)
    if key not in _cache:
        text = (ROOT / plan).read_text(encoding="utf-8")
        for setting in settings:
            text = with_setting(text, setting)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(plan).name
            path.write_text(text, encoding="utf-8")
            out, err = planc_output(["explain", str(path), *flags])
        _cache[key] = (out.replace(str(path), plan), err.replace(str(path), plan))
    return _cache[key]


def explain(plan: str, settings: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> str:
    """The text of ``planc explain`` (then its messages on stderr), search timings dropped."""
    out, err = _explained(plan, settings, flags)
    return SEARCH_TIME.sub("", out + err)


def explain_json(plan: str, settings: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> dict:
    out, err = _explained(plan, settings, (*flags, "--json"))
    if not out.strip():
        raise ValueError(f"planc explain --json {plan} with {settings}: {err.strip()}")
    return json.loads(out)


def sections(text: str) -> dict[str, str]:
    """The output's blank-line-separated parts, by first word ("header" for the first)."""
    parts: dict[str, str] = {}
    for index, part in enumerate(p for p in text.split("\n\n") if p.strip()):
        name = "header" if index == 0 else part.split()[0].lower()
        # The layout line reads "closest" when nothing fits: still the "chosen" section of a keep=.
        parts["chosen" if name == "closest" else name] = part.rstrip("\n")
    return parts


def abridged(text: str, options: dict[str, list[str]]) -> str:
    if "keep" in options:
        wanted = [name for spec in options["keep"] for name in spec.split(",")]
        parts = sections(text)
        if not any(name in parts for name in wanted):  # explain's output changed shape
            raise ValueError(f"keep={','.join(wanted)}: none of these sections in the output ({', '.join(parts)})")
        text = "\n\n".join(parts[name] for name in wanted if name in parts)
    for pattern in options.get("grep", []):
        text = "\n".join(line for line in text.splitlines() if re.search(pattern, line))
    return text.rstrip("\n") + "\n"


def changed_lines(before: str, after: str) -> str:
    """Only the lines that differ, ``-`` before and ``+`` after."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
    lines = [line for line in diff if not line.startswith(("---", "+++", "@@"))]
    return "\n".join(f"{line[0]} {line[1:]}" for line in lines) + "\n" if lines else "(no line changes)\n"


def json_value(data: dict, path: str):
    value: object = data
    for part in path.split("."):
        if isinstance(value, list):  # comm: a list of groups, keyed here by "group"
            value = {item.get("group"): item for item in value}
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


UNITS = {
    "GiB": lambda v: f"{v / 2**30:.1f} GiB",
    "MiB": lambda v: f"{v / 2**20:.0f} MiB",
    "s": lambda v: f"{v:.2f} s",
    "ms": lambda v: f"{v * 1e3:.1f} ms",
    "%": lambda v: f"{v * 100:.0f}%",
    "k": lambda v: f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k",
    "x": lambda v: f"{v:.2f}×",
    "GB/s": lambda v: f"{v / 1e9:g} GB/s",
    "n": lambda v: f"{v:.0f}",
}


def cell(data: dict, spec: str) -> str:
    path, _, unit = spec.partition(":")
    value = json_value(data, path)
    if value is None:
        return "–"
    if unit:
        return UNITS[unit](float(value))
    if isinstance(value, dict):  # a layout
        return f"TP {value['tp']} × PP {value['pp']} × DP {value['dp']} · ZeRO-{value['zero']}"
    return str(value)


def table(plan: str, options: dict[str, list[str]], flags: tuple[str, ...]) -> str:
    varied = [(spec.split(":")[0], spec.split(":", 1)[1].split(",")) for spec in options["vary"]]
    columns = [col.split(":", 1) for col in options["col"]]
    header = [key for key, _ in varied] + [label for label, _ in columns]
    rows = [header, ["---"] * len(header)]
    for values in zip(*(vals for _, vals in varied), strict=True):
        settings = tuple(f"{key}={value}" for (key, _), value in zip(varied, values, strict=True))
        data = explain_json(plan, settings, flags)
        rows.append([*values, *(cell(data, spec) for _, spec in columns)])
    for index, (label, spec) in enumerate(columns, start=len(varied)):
        if all(row[index] == "–" for row in rows[2:]):  # a JSON field renamed or gone
            raise ValueError(f"col={label}:{spec}: no row of planc explain --json has {spec.split(':')[0]}")
    return "".join("| " + " | ".join(row) + " |\n" for row in rows)


def collectives(plan: str, options: dict[str, list[str]]) -> str:
    """The faster of ring and tree all-reduce (planc.cost.comm; "(tree)" where the tree won), on
    the plan's hardware with ``set=`` changes applied, for groups of ranks 0, k, 2k, ..."""
    from planc.cost.comm import all_reduce_seconds, reduce_scatter_seconds
    from planc.dsl.load import load_plan
    from planc.hardware.topology import topology_for
    from planc.strategies.registry import load_registry

    text = (ROOT / plan).read_text(encoding="utf-8")
    for setting in options.get("set", []):
        text = with_setting(text, setting)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(plan).name
        path.write_text(text, encoding="utf-8")
        topology = topology_for(load_plan(path, strategies=load_registry()).hardware)
    sizes = [float(s) for s in options["sizes"][0].split(",")]
    rows = ["| ranks | link | " + " | ".join(f"{s:g} MiB" for s in sizes) + " |\n"]
    rows.append("|---" * (len(sizes) + 2) + "|\n")
    stride = int(options.get("stride", ["1"])[0])
    for group in (int(g) for g in options["groups"][0].split(",")):
        link = topology.link_of(list(range(0, group * stride, stride)))
        times = [all_reduce_seconds(size * 2**20, link) * 1e3 for size in sizes]
        # A ring all-reduce is a reduce-scatter then an all-gather; faster than that: the tree won.
        rings = [2 * reduce_scatter_seconds(size * 2**20, link) * 1e3 for size in sizes]
        medium = f"{link.medium} {link.bandwidth / 1e9:g} GB/s, α {link.latency * 1e6:g} µs"
        if link.crosses_nodes:
            medium += f" ({link.nodes} nodes × {link.per_node})"
        cells = [f"{t:.3g} ms" + (" (tree)" if t < r * 0.999 else "") for t, r in zip(times, rings, strict=True)]
        rows.append(f"| {group} | {medium} | " + " | ".join(cells) + " |\n")
    return "".join(rows)


def parse_args(args: str) -> tuple[str, list[str], dict[str, list[str]], tuple[str, ...]]:
    words = shlex.split(args)
    kind, rest = words[0], words[1:]
    positional, options, flags = [], {}, []
    for word in rest:
        if word.startswith("-"):
            flags.append(word)
        elif re.match(r"^[a-z]+=", word):
            name, _, value = word.partition("=")
            options.setdefault(name, []).append(value)
        elif flags and flags[-1] in ("--tolerance", "--top", "--runtime"):
            flags.append(word)
        else:
            positional.append(word)
    return kind, positional, options, tuple(flags)


def render(args: str, old: str) -> str:
    """The new body of one block (a fenced code block, or a table)."""
    if args.split()[0] == "run":
        return old  # refreshed by run_block only, on request
    kind, positional, options, flags = parse_args(args)
    plan = positional[0] if positional else ""
    settings = tuple(options.get("set", []))
    if kind == "plan":
        return fenced((ROOT / plan).read_text(encoding="utf-8"))
    if kind == "source":
        return fenced(source_lines(plan, options["from"][0], options["to"][0]), lang="python")
    if kind == "explain":
        return fenced(abridged(explain(plan, settings, flags), options))
    if kind == "try":
        before = abridged(explain(plan, settings, flags), options)
        after = abridged(explain(plan, settings + tuple(options["change"]), flags), options)
        return fenced(changed_lines(before, after), lang="diff")
    if kind == "table":  # blank lines around a table: Markdown must not read the markers as rows
        return "\n" + table(plan, options, flags) + "\n"
    if kind == "collectives":
        return "\n" + collectives(plan, options) + "\n"
    raise ValueError(f"unknown block kind {kind!r} in <!-- planc:begin {args} -->")


def source_lines(path: str, start: str, end: str) -> str:
    """The lines of ``path`` from the first matching ``start`` to the next matching ``end``."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    first = next((i for i, line in enumerate(lines) if re.search(start, line)), None)
    if first is None:
        raise ValueError(f"source {path}: no line matches from={start!r}")
    last = next((i for i in range(first, len(lines)) if re.search(end, lines[i])), None)
    if last is None:
        raise ValueError(f"source {path}: no line after {first + 1} matches to={end!r}")
    return "\n".join(lines[first : last + 1]) + "\n"


def fenced(text: str, lang: str = "text") -> str:
    return f"```{lang}\n{text}```\n"


def number(args: str) -> str:
    kind, positional, options, flags = parse_args("num " + args)
    data = explain_json(positional[0], tuple(options.get("set", [])), flags)
    value = cell(data, positional[1])
    if value == "–":
        raise ValueError(f"planc:num {args}: planc explain --json has no {positional[1].split(':')[0]}")
    return value


def refresh(text: str) -> str:
    text = BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(4), text)
    return NUMBER.sub(lambda m: m.group(1) + number(m.group(2)) + m.group(4), text)


RUN_NOISE = (  # what varies from run to run: timings, pids, ports, clock times, host names
    (re.compile(r"\b\d+(\.\d+)? (k |M )?tok/s"), "_ tok/s"),
    (re.compile(r"\b\d+\.\d+ s/step( \(pred [0-9.]+( ±\d+%|, uncalibrated)?\))?"), "_ s/step"),
    (re.compile(r"mfu [0-9.]+%( \(pred [0-9.]+%\))?"), "mfu _"),
    (re.compile(r"\b\d+:\d\d elapsed, \d+:\d\d left"), "_ elapsed"),
    (re.compile(r"\b(mem|rss) [0-9.]+ GiB"), r"\1 _ GiB"),
    (re.compile(r"saved \([0-9.]+ s\)"), "saved (_ s)"),
    (re.compile(r"\bpid \d+"), "pid _"),
    (re.compile(r"\]:\d+"), "]:_"),
    (re.compile(r"\bat \d\d:\d\d:\d\d"), "at _"),
    (re.compile(r"\b[0-9.]+ s ago"), "_ s ago"),
    (re.compile(r" on [\w.-]+\)"), " on HOST)"),
    (
        re.compile(r"measured peak [0-9.]+ \w+ on (rank \d+|the busiest rank) \([0-9.]+×\)"),
        r"measured peak _ on \1 (_×)",
    ),
    (
        re.compile(r"measured median [0-9.]+ s per step over (\d+) step\(s\) (\(.*?\)); [0-9.]+× the"),
        r"measured median _ s per step over \1 step(s) \2; _× the",
    ),
)
TORCH_LOG_LINE = re.compile(r"^[WIE]\d{4} \d\d:\d\d:\d\d")  # torch's own logger, timestamped


def masked(text: str, drop: list[str]) -> str:
    lines = []
    for line in text.splitlines():
        if TORCH_LOG_LINE.match(line) or any(re.search(pattern, line) for pattern in drop):
            continue
        for pattern, replacement in RUN_NOISE:
            line = pattern.sub(replacement, line)
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_command(args: str) -> tuple[dict[str, list[str]], str]:
    """``run [fresh=DIR] [drop=REGEX] -- COMMAND``: the options and the command line as written."""
    head, _, command = args.partition(" -- ")
    _kind, _positional, options, _flags = parse_args(head)
    return options, command.strip()


def run_block(args: str) -> str:
    """Run COMMAND in bash at the repository root for real (``fresh`` directories removed first)
    and return its output, run-to-run noise masked and ``drop`` lines left out."""
    options, command = run_command(args)
    for directory in options.get("fresh", []):
        target = (ROOT / directory).resolve()
        if ROOT / "runs" not in target.parents:
            raise ValueError(f"fresh={directory}: only directories under runs/ are removed")
        shutil.rmtree(target, ignore_errors=True)
    done = subprocess.run(  # one stream, in the order the terminal would show it
        ["bash", "-c", command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = masked(done.stdout, options.get("drop", []))
    return fenced(f"$ {command}\n{output}" + (f"(exit status {done.returncode})\n" if done.returncode else ""))


def refresh_runs(text: str) -> str:
    def rewrite(m: re.Match) -> str:
        if m.group(2).split()[0] != "run":
            return m.group(0)
        return m.group(1) + run_block(m.group(2)) + m.group(4)

    return BLOCK.sub(rewrite, text)


def run_plans(text: str) -> list[str]:
    """The .plan files that the page's run blocks use."""
    commands = [run_command(m.group(2))[1] for m in BLOCK.finditer(text) if m.group(2).startswith("run ")]
    return [word for command in commands for word in shlex.split(command) if word.endswith(".plan")]


if __name__ == "__main__":
    print(refresh(sys.stdin.read()), end="")
