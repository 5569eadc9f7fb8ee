"""What happened to a run, from its directory alone: the analysis behind `planc doctor`.

:func:`diagnose` turns a :class:`~planc.rundir.state.RunState` into a :class:`Diagnosis` -- an ordered
list of titled sections of plain sentences, plus the same facts as JSON -- so that the person who
finds a failed run in the morning learns, without reading logs: how far it got and what a resume
loses, every restart and its cause, each rank's last error, any hang (which rank, which collective,
which step), the state of every checkpoint, measured against predicted memory and step time, and
what to do next.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planc.rundir.events import last_event
from planc.rundir.heartbeats import FINAL_STATES, newest_attempt
from planc.rundir.state import RunState
from planc.units import format_bytes

#: A run whose newest heartbeat is younger than this, with no end recorded, is taken to be running.
RUNNING_WITHIN_S = 120.0


@dataclass
class Diagnosis:
    status: str  # finished | stopped | failed | running | not started
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, title: str, lines: list[str]) -> None:
        if lines:
            self.sections.append((title, lines))

    def text(self) -> str:
        width = max((len(title) for title, _ in self.sections), default=0) + 2
        out = []
        for title, lines in self.sections:
            out.append(f"{title:<{width}}{lines[0]}")
            out += [" " * width + line for line in lines[1:]]
        return "\n".join(out)


def diagnose(state: RunState, now: float | None = None) -> Diagnosis:
    now = time.time() if now is None else now
    status, last = _status(state, now)
    report = Diagnosis(status=status)
    report.add("run", _run_line(state))
    report.add("status", [last])
    report.add("progress", _progress(state, report.facts))
    report.add("checkpoints", _checkpoints(state))
    report.add("restarts", _restarts(state))
    report.add("hangs", _hangs(state))
    report.add("errors", (_ending(state) if status == "failed" else []) + _errors(state))
    report.add("memory", _memory(state))
    report.add("step time", _step_time(state))
    report.add("next", _next_steps(state, status))
    report.facts.update(status=status, run_dir=str(state.run_dir))
    return report


def _since_launch(state: RunState) -> list[dict[str, Any]]:
    launched = last_event(state.events, "launch")
    return [e for e in state.events if launched is None or e["time"] >= launched["time"]]


def _status(state: RunState, now: float) -> tuple[str, str]:
    events = _since_launch(state)
    end = last_event(events, "finished", "stopped", "end")
    beats = list(state.heartbeats.values())
    fresh = [
        b for b in beats if now - float(b.get("time", 0)) < RUNNING_WITHIN_S and b.get("state") not in FINAL_STATES
    ]
    if not state.events and not state.metrics and not beats:
        return "not started", "not started: no events, metrics or heartbeats in this directory"
    if fresh and (end is None or end["event"] != "end"):
        step = max(b.get("step", 0) for b in fresh)
        return (
            "running",
            f"running: {len(fresh)} rank(s) sent a heartbeat in the last {RUNNING_WITHIN_S:.0f} s, at step {step}",
        )
    finished, stopped = last_event(events, "finished"), last_event(events, "stopped")
    ended = last_event(events, "end")
    unsaved = state.unsaved_finish()
    if unsaved is not None and finished is not None and unsaved is finished:
        newest = state.newest_checkpoint
        return "failed", (
            f"failed: all {finished['step']} step(s) trained, but the checkpoint of step {finished['step']} could "
            f"not be saved; the newest complete checkpoint is {f'step {newest.step}' if newest else 'none'}"
        )
    if finished is not None and (ended is None or ended.get("status") != "failed"):
        return "finished", f"finished: all {finished['step']} step(s) trained"
    if stopped is not None and (ended is None or ended.get("status") != "failed"):
        saved = "a checkpoint was saved there" if stopped.get("checkpoint") else "no checkpoint could be saved"
        return "stopped", f"stopped by {stopped.get('signal') or 'request'} after step {stopped['step']}; {saved}"
    step = max([r["step"] for r in state.metrics] or [0])
    return "failed", f"failed: {step} step(s) logged, then the processes ended without finishing"


def _run_line(state: RunState) -> list[str]:
    record = state.record or {}
    plan = record.get("plan") or {}
    layout = last_event(state.events, "attempt") or last_event(state.events, "launch") or {}
    parts = [str(state.run_dir)]
    if plan:
        parts.append(f"model {plan.get('model', {}).get('name') or 'unnamed'}")
        parts.append(f"plan {plan_file_from_here(state) if plan.get('source') else '?'}")
    if layout.get("layout"):
        parts.append(f"{layout['layout']} on {layout.get('world_size', '?')} process(es)")
    if state.resume_source:
        parts.append(f"continued from {state.resume_source['from_run']} at step {state.resume_source['step']}")
    return [" · ".join(parts)]


def _target_step(state: RunState) -> int | None:
    """The step the run trains to: its latest attempt's (a run started in place by torchrun has no
    launch event), else its launch's ``--steps``, else the plan's (run directories written before
    attempts recorded it)."""
    attempt, launch = last_event(state.events, "attempt") or {}, last_event(state.events, "launch") or {}
    planned = ((state.plan or {}).get("train") or {}).get("steps")
    target = attempt.get("target_step") or launch.get("steps") or planned
    return int(target) if target else None


def _progress(state: RunState, facts: dict[str, Any]) -> list[str]:
    logged = max([r["step"] for r in state.metrics] or [0])
    target = _target_step(state)
    newest = state.newest_checkpoint
    facts.update(logged_step=logged, target_step=target, checkpoint_step=newest.step if newest else None)
    lines = [f"{logged} of {target or '?'} step(s) logged in metrics.jsonl"]
    if state.checkpoint_dir is None:
        lines.append("no checkpoint block in the plan: a new run starts from step 0")
    elif newest is None:
        lines.append("no complete checkpoint: a new run starts from step 0")
    else:
        lost = max(0, logged - newest.step)
        lines.append(
            f"newest complete checkpoint: {newest.path.name} (step {newest.step}); resuming repeats {lost} step(s)"
        )
    if state.discarded:
        lines.append(f"{len(state.discarded)} step(s) were trained twice after restarts (metrics.discarded.jsonl)")
    return lines


def _checkpoints(state: RunState) -> list[str]:
    lines = []
    for entry in state.checkpoints:
        problems = state.problems.get(entry.path)
        if entry.state == "complete":
            lines.append(f"{entry.path.name}: " + ("DAMAGED: " + "; ".join(problems) if problems else "complete"))
        elif entry.state == "corrupt":
            lines.append(f"{entry.path.name}: found damaged on resume and skipped (kept for inspection)")
        else:
            lines.append(f"{entry.path.name}: partial (a save was interrupted); never loaded, removed at the next save")
    for event in state.events:
        if event["event"] == "checkpoint_failed":
            errors = "; ".join(f"rank {r}: {m}" for r, m in sorted((event.get("errors") or {}).items()))
            lines.append(f"save of step {event.get('step')} failed: {errors}")
        elif event["event"] == "checkpoint_skipped":
            lines.append(f"step {event.get('step')} skipped on resume: {'; '.join(event.get('problems') or [])}")
    return lines


def _restarts(state: RunState) -> list[str]:
    lines = []
    failures = [e for e in state.events if e["event"] in ("worker_failed", "agent_lost")]
    for event in state.events:
        if event["event"] == "attempt" and event.get("attempt", 0) > 0:
            clock = time.strftime("%H:%M:%S", time.localtime(event["time"]))
            seen = [f for f in failures if f["time"] <= event["time"]]
            observed = _describe_failure_event(seen[-1]) if seen else None
            causes = "; ".join(event.get("causes") or []) or "cause unknown"
            lines.append(
                f"restart {event['attempt']} at {clock}, from step {event.get('start_step', 0)}: {causes}"
                + (f" [observed: {observed}]" if observed else "")
            )
    return lines


def _describe_failure_event(event: dict[str, Any]) -> str:
    if event["event"] == "agent_lost":
        return f"the torchrun agent was killed by {event.get('signal')}"
    how = f"killed by {event['signal']}" if event.get("signal") else f"exit code {event.get('exitcode')}"
    return f"local rank {event.get('local_rank')} (pid {event.get('pid')}) {how}"


def _hangs(state: RunState) -> list[str]:
    lines = []
    for event in state.events:
        if event["event"] == "hang":
            coll = event.get("collective") or {}
            what = f"{coll.get('name', 'a collective')} #{coll.get('seq', '?')} ({coll.get('group', '?')})"
            missing = ", ".join(map(str, event.get("missing") or [])) or "none named"
            lines.append(
                f"step {event.get('step')}: {what} timed out after {event.get('timeout_s')} s; "
                f"did not arrive: rank(s) {missing}; waiting: rank(s) {', '.join(map(str, event.get('waiting') or []))}"
            )
        elif event["event"] == "deadline_exceeded":
            lines.append(f"rank {event.get('rank')} missed its stop deadline in step {event.get('step', 0) + 1}")
    return lines


def _ending(state: RunState) -> list[str]:
    """The failure torchrun saw end the last attempt (a restart's is under *restarts*): a rank killed
    without a word (SIGKILL, the OOM killer) leaves no message of its own, and its heartbeat only says
    where it was, so this is the one place that says how it ended. Left out after a hang, whose hung
    rank is ended by a signal that is not the cause (the *hangs* section names it)."""
    attempt = last_event(state.events, "attempt")
    since = [e for e in state.events if attempt is None or e["time"] >= attempt["time"]]
    if last_event(since, "hang") is not None:
        return []
    failures = [e for e in since if e["event"] in ("worker_failed", "agent_lost")]
    return [f"the first failure, as torchrun saw it: {_describe_failure_event(failures[0])}"] if failures else []


def _errors(state: RunState) -> list[str]:
    lines = []
    for beat in newest_attempt(state.heartbeats):
        rank = beat["rank"]
        message, beat_state = beat.get("message"), beat.get("state")
        if message:
            lines.append(message if message.startswith("rank ") else f"rank {rank}: {message}")
        elif beat_state == "deadline_exceeded":
            lines.append(f"rank {rank}: did not stop within the stop deadline (its stacks are in the log)")
        elif beat_state in ("training", "saving", "starting"):
            lines.append(f"rank {rank}: no error recorded; last seen {beat_state} after {beat.get('step')} step(s)")
    return lines[:16] + ([f"... and {len(lines) - 16} more"] if len(lines) > 16 else [])


def _memory(state: RunState) -> list[str]:
    predicted = ((state.record or {}).get("prediction") or {}).get("memory_bytes")
    measured = max((r.get("memory_bytes") or 0 for r in state.metrics), default=0)
    if not predicted and not measured:
        return []
    device = (((state.record or {}).get("plan") or {}).get("hardware") or {}).get("device", "?")
    line = f"predicted {format_bytes(predicted)} per device" if predicted else "no prediction"
    if measured:
        line += f"; measured peak {format_bytes(measured)} on the busiest rank"
        if predicted:
            line += f" ({measured / predicted:.2f}×)"
    lines = [line]
    if device == "cpu":
        lines.append("on CPU the measurement is the process's peak resident memory, Python and torch included")
    return lines


def _step_time(state: RunState) -> list[str]:
    predicted = ((state.record or {}).get("prediction") or {}).get("step_s")
    times = [r["step_s"] for r in state.metrics[1:] if isinstance(r.get("step_s"), (int, float))]
    if not times:
        return [f"predicted {predicted:.3g} s per step; nothing measured yet"] if predicted else []
    median = statistics.median(times)
    line = f"measured median {median:.3g} s per step over {len(times)} step(s) (the first left out)"
    if predicted:
        line = f"predicted {predicted:.3g} s; " + line + f"; {median / predicted:.2f}× the prediction"
    return [line]


def plan_file_from_here(state: RunState) -> str:
    """The run's plan file as a command typed here names it: relative to this directory when it is
    below it, else absolute (``plan.json``'s ``plan_file``, recorded absolute at launch). A run
    directory from before that record has only the path as written then, relative to a directory
    that may not be this one."""
    recorded = (state.record or {}).get("plan_file")
    if not isinstance(recorded, str):
        return (state.plan or {}).get("source") or "PLAN"
    path = Path(recorded)
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _next_steps(state: RunState, status: str) -> list[str]:
    again = f"planc run {plan_file_from_here(state)} --out {state.run_dir}"
    newest = state.newest_checkpoint
    lines = []
    if status == "running":
        lines.append("nothing yet: the run is in progress")
    elif status == "finished":
        if state.rerun_refused(state.plan or {}):
            lines.append(
                "nothing: the run is finished. It has no checkpoint to train further from: "
                f"`{again} --fresh` starts over"
            )
        else:
            lines.append(f"nothing: the run is finished. `{again} --steps N` trains further")
    elif status == "stopped":
        lines.append(f"resume with `{again}`" + (f" (from step {newest.step})" if newest else " (from step 0)"))
    elif status == "failed":
        lines += _failure_advice(state, again)
    if any(e.state == "corrupt" for e in state.checkpoints) or state.problems:
        lines.append(f"inspect, then delete, the damaged checkpoint directories in {state.checkpoint_dir}")
    if any(e["event"] == "checkpoint_failed" for e in state.events):
        lines.append(f"check the free space and health of the file system of {state.checkpoint_dir}")
    return lines


def _failure_advice(state: RunState, again: str) -> list[str]:
    lines = []
    hang = last_event(_since_launch(state), "hang")
    messages = " ".join(str(b.get("message", "")) for b in state.heartbeats.values())
    if hang is not None:
        missing = ", ".join(map(str, hang.get("missing") or [])) or "?"
        lines.append(
            f"find out why rank(s) {missing} stopped taking part in step {hang.get('step')} (their stack is in the "
            "log, their host in the heartbeat); raise train.timeout if a step or a save can really take that long"
        )
    if "out of device memory" in messages:
        lines.append("`planc explain` the plan: lower the micro-batch, add recompute or raise the ZeRO stage")
    restarts = [e for e in _since_launch(state) if e["event"] == "attempt" and e.get("attempt", 0) > 0]
    if restarts:
        lines.append(f"{len(restarts)} restart(s) did not get past the failure: it is probably not transient")
    lines.append(rerun_after_failure(state, state.plan or {}, again))
    return lines


def rerun_after_failure(state: RunState, plan: dict[str, Any], again: str) -> str:
    """What running ``again`` (``planc run PLAN --out RUN_DIR``) does after a failure, as `planc run` will
    decide it (:meth:`RunState.rerun_refused`): `planc run`'s last hint and `planc doctor`'s advice.

    Before the first checkpoint is saved there is nothing to resume: the same command is refused
    once steps are logged (it would mix two runs in metrics.jsonl), so the advice must name --fresh.
    """
    newest = state.newest_checkpoint
    if state.rerun_refused(plan):
        why = "no checkpoint was saved before the failure" if newest is None else "the plan sets resume = false"
        return f"{why}, so `{again}` is refused: fix the cause, then `{again} --fresh` starts over"
    if newest is not None:
        return f"fix the cause, then `{again}` resumes from the newest complete checkpoint (step {newest.step})"
    if state.resume_source is not None:
        return f"fix the cause, then `{again}` starts again from the checkpoint it was resumed from"
    return f"fix the cause, then `{again}` starts over (no checkpoint was saved before the failure)"
