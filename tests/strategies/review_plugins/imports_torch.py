import torch  # noqa: F401  (at module level, against the two-faces rule)

NAME = "imports_torch"
API_VERSION = 1
DESCRIPTION = "test"


def apply(job, options):
    pass
