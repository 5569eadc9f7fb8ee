NAME = "enabled_raises"
API_VERSION = 1
DESCRIPTION = "enabled() has a bug"


def enabled(plan, layout):
    return layout.dp_size > 1  # typo: Layout has dp, not dp_size


def apply(job, options):
    pass
