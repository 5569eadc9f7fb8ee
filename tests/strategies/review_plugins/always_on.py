NAME = "always_on"
API_VERSION = 1
DESCRIPTION = "takes part in every plan, used or not"


def enabled(plan, layout):
    return True


def cost(ctx, estimate, options):
    return estimate.with_time("always_on: a second per step", 1.0)


def apply(job, options):
    pass
