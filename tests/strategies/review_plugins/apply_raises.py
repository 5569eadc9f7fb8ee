NAME = "apply_raises"
API_VERSION = 1
DESCRIPTION = "raises at run time"


def apply(job, options):
    raise RuntimeError("apply_raises: my apply failed on purpose")
