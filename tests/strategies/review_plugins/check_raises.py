NAME = "check_raises"
API_VERSION = 1
DESCRIPTION = "test"


def apply(job, options):
    pass


def check(plan, layout, options):
    return layout.nonexistent_attribute
