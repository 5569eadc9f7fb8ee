from pydantic import BaseModel  # noqa: F401  (a plan-time import, as a real plugin has)

NAME = "broken_deep"
API_VERSION = 1
DESCRIPTION = "fails while importing, deep in the module"


def helper():
    return undefined_name  # noqa: F821  (line 9)


DEFAULT = helper()


def apply(job, options):
    pass
