"""Compose a job from the strategy registry: what an emitted program spells out line by line.

``compose(plan, layout)`` is the generic form of the program ``planc compile`` writes::

    job = Job.create(plan, layout)
    for strategy in registry.active(plan, layout):       # composition order (AFTER, topologically)
        strategy.apply(job, strategy.options_for(plan, layout))
    job.init_weights()
    job.build_optimizer()

The emitted program names each strategy and its options instead of looping, so a reader sees
exactly what runs; both go through the same ``apply`` functions.
"""

from __future__ import annotations

from planc.runtime.job import Job
from planc.spec import Layout, Plan
from planc.spec.issues import SpecError
from planc.strategies.registry import Registry


def compose(plan: Plan, layout: Layout, registry: Registry, *, device: str | None = None) -> Job:
    """A ready-to-train job: every strategy of ``registry`` active in ``layout`` applied in order,
    weights initialised, optimizer built."""
    job = compose_on_meta(plan, layout, registry, device=device)
    job.init_weights()
    job.build_optimizer()
    return job


def compose_on_meta(plan: Plan, layout: Layout, registry: Registry, *, device: str | None = None) -> Job:
    """Phases 1 and 2 of :func:`compose`: the mesh, and every active strategy applied to the model
    while it is still on the meta device (``planc verify --simulate`` allocates it under fake tensors)."""
    active = registry.active(plan, layout)
    issues = registry.check(plan, layout)
    if issues:
        raise SpecError(issues)
    job = Job.create(plan, layout, device=device)
    for strategy in active:
        strategy.apply(job, strategy.options_for(plan, layout))
    return job
