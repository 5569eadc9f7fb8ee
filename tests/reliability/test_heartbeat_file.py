"""The heartbeat file is rewritten in place (no rename, no truncation per beat) and always reads back whole."""

from __future__ import annotations

import os

from planc.rundir.heartbeats import RECORD_BYTES, Heartbeat, heartbeat_path, read_heartbeats


def test_beats_rewrite_one_file_in_place_and_read_back_as_the_last(tmp_path):
    beat = Heartbeat(tmp_path, rank=1, attempt=0)
    beat.beat(0, "training", current_step=1)
    inode = os.stat(heartbeat_path(tmp_path, 1)).st_ino
    for step in range(1, 12):  # 11 -> 12: a longer record over a shorter one
        beat.beat(step, "training", current_step=step + 1)
    path = heartbeat_path(tmp_path, 1)
    assert os.stat(path).st_ino == inode  # the same file: written in place, never renamed over
    assert os.path.getsize(path) == RECORD_BYTES
    record = read_heartbeats(tmp_path)[1]
    assert (record["step"], record["state"], record["current_step"]) == (11, "training", 12)
    beat.close()


def test_a_record_too_long_for_in_place_is_renamed_in_whole_and_beats_go_on_after_it(tmp_path):
    beat = Heartbeat(tmp_path, rank=0, attempt=2)
    beat.beat(3, "training", current_step=4)
    message = "x" * (2 * RECORD_BYTES)
    beat.beat(3, "failed", message=message)
    assert read_heartbeats(tmp_path)[0]["message"] == message
    # A later short beat reopens the renamed file and leaves none of the long record behind.
    beat.beat(4, "stopped")
    assert os.path.getsize(heartbeat_path(tmp_path, 0)) == RECORD_BYTES
    record = read_heartbeats(tmp_path)[0]
    assert (record["step"], record["state"], record["attempt"]) == (4, "stopped", 2)
    assert "message" not in record
    beat.close()
