"""The ``.plan`` language front end: text -> syntax tree -> validated :class:`~planc.spec.Plan`.

- :func:`load_plan` / :func:`load_plan_text` — what every later stage calls;
- :func:`parse` — text to the syntax tree (:mod:`planc.dsl.ast`), for tools such as ``fmt``;
- :func:`format_plan` — the canonical text of a syntax tree (``planc fmt``).

Nothing here imports torch.
"""

from planc.dsl.fmt import format_plan
from planc.dsl.load import load_plan, load_plan_text
from planc.dsl.parser import parse

__all__ = ["format_plan", "load_plan", "load_plan_text", "parse"]
