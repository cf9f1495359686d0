"""A griffe extension for the API reference: the docstrings are written for readers of
the source and use reStructuredText roles (``:class:`Loom```, ``:meth:`~Entity.steer```);
Markdown would show the role's name literally. Each role becomes a code span of its
target (``~`` keeps the last dotted part, as Sphinx does), so the page reads as the
source does."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every reST role replaced by a Markdown code span of its target."""

    def span(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2).strip()
        if short:
            target = target.rsplit(".", 1)[-1]
        return f"`{target}`"

    return ROLE.sub(span, text)


class PlainRoles(griffe.Extension):
    """Rewrites roles in every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
