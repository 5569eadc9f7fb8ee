from pydantic import BaseModel, ConfigDict

NAME = "weird_schema"
API_VERSION = 1
DESCRIPTION = "Options with a field type the .plan language cannot write"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    table: dict[str, int] = {}
    """A mapping."""


def apply(job, options):
    pass
