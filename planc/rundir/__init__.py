"""A run directory's files, readable without torch (the launcher, ``planc doctor`` and the workers share them).

::

    plan.json                 the validated plan, the chosen layout, the prediction (launch.write_run_dir)
    train.py                  the emitted program
    metrics.jsonl             one record per optimizer step of the run's one trajectory (metrics_file)
    metrics.discarded.jsonl   steps trained and then discarded: a restart resumed from an earlier checkpoint
    events.jsonl              what happened: launches, attempts, restarts, checkpoints, stops, hangs (events)
    heartbeats/rank-N.json    each rank's latest step and state, rewritten every step (heartbeats)
    resume.json               where a run continued from another run's checkpoint (carry_over)
    checkpoints/step-N/       complete checkpoints, each with manifest.json (checkpoints, manifest)
    flight_recorder/rank-N    NCCL flight-recorder dumps written on a collective timeout (GPU runs; flight_recorder)

Writers never let a diagnostic file stop training: a failed write of an event or heartbeat is skipped.
"""
