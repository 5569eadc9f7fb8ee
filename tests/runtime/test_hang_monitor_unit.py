"""planc's hang monitor without processes: when a rank counts as waiting too long, and that the
thread calls back once, only for a rank that waits in a collective of the phase it was armed for."""

from __future__ import annotations

import threading
import time

from planc.runtime.hangs import HangMonitor, seconds_until_hung

S = 1_000_000_000  # ns per s
ARMED = 1_000 * S


def entry(created_s: float, state: str = "scheduled") -> dict:
    return {"time_created_ns": ARMED + int(created_s * S), "state": state, "record_id": 1}


def test_a_collective_of_the_phase_counts_from_its_creation():
    # created 2 s into the phase, now 9 s in, timeout 10 s: 10 - (9 - 2) = 3 s left
    assert seconds_until_hung(entry(2), armed_ns=ARMED, now_ns=ARMED + 9 * S, timeout=10) == 3
    assert seconds_until_hung(entry(2), armed_ns=ARMED, now_ns=ARMED + 13 * S, timeout=10) == -1  # hung 1 s ago


def test_a_rank_waiting_in_no_collective_of_the_phase_is_not_hung():
    later = dict(armed_ns=ARMED, now_ns=ARMED + 60 * S, timeout=10)
    assert seconds_until_hung(None, **later) is None  # no flight recorder, or no collective yet
    assert seconds_until_hung(entry(-1), **later) is None  # the last one is the previous step's: stuck before
    assert seconds_until_hung(entry(2, state="completed"), **later) is None  # NCCL saw it finish


def _monitor(newest, timeout=0.2):
    calls: list[tuple[int, str | None]] = []
    called = threading.Event()

    def on_hang(step, phase):
        calls.append((step, phase))
        called.set()

    return HangMonitor(timeout, on_hang, newest=newest), calls, called


def test_the_monitor_calls_back_for_a_collective_older_than_the_timeout():
    box: dict = {}
    monitor, calls, called = _monitor(lambda: box.get("entry"))
    monitor.arm(4, "while saving the checkpoint of step 3")
    box["entry"] = {"time_created_ns": time.time_ns(), "state": "scheduled"}  # joined a collective just now
    assert called.wait(5)
    monitor.close()
    assert calls == [(4, "while saving the checkpoint of step 3")]


def test_the_monitor_leaves_a_rank_outside_collectives_and_a_disarmed_one_alone():
    before = {"time_created_ns": time.time_ns() - 10 * S, "state": "scheduled"}  # before the arming
    monitor, calls, called = _monitor(lambda: before)
    monitor.arm(2)
    assert not called.wait(0.6)  # three timeouts: the rank is the one stuck elsewhere, or merely slow
    now = {"time_created_ns": time.time_ns(), "state": "scheduled"}
    monitor._newest = lambda: now  # joins a collective ...
    monitor.disarm()  # ... and the step ends
    assert not called.wait(0.6)
    monitor.close()
    assert calls == []


def test_a_step_armed_while_the_thread_sleeps_is_watched_from_its_own_start():
    """arm() does not wake a thread asleep until an earlier phase's deadline (no wake-up per step):
    the thread finds the newer phase when it wakes and reports it at that phase's own deadline."""
    box: dict = {}
    monitor, calls, called = _monitor(lambda: box.get("entry"), timeout=0.4)
    monitor.arm(1)
    time.sleep(0.2)
    armed = time.time()
    monitor.arm(2)
    box["entry"] = {"time_created_ns": time.time_ns(), "state": "scheduled"}
    assert called.wait(5)
    reported = time.time()
    monitor.close()
    assert calls == [(2, None)]
    assert reported - armed >= 0.4 - 0.01  # step 2's deadline, not step 1's (0.2 s earlier)


def test_a_phase_armed_after_the_thread_went_idle_wakes_it():
    box: dict = {}
    monitor, calls, called = _monitor(lambda: box.get("entry"), timeout=0.2)
    monitor.arm(1)
    monitor.disarm()
    time.sleep(0.5)  # past step 1's deadline: the thread found no phase and waits for one
    monitor.arm(3, "while resuming")
    box["entry"] = {"time_created_ns": time.time_ns(), "state": "scheduled"}
    assert called.wait(5)
    monitor.close()
    assert calls == [(3, "while resuming")]
