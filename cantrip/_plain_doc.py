"""A docstring as a reader outside Python sees it: reStructuredText markup removed.

Gate descriptions come from docstrings written for Sphinx (````path````, ``:func:`x```).
An A2A Agent Card shows them to people choosing an agent; there the markup is noise.
Only inline markup is rewritten; the words stay as written.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)(?:\s*<[^`>]*>)?`")
"""``:func:`name```, ``:class:`~a.b.C```, ``:ref:`text <target>```: the name or text."""
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")
"""```text <https://...>`_``: the text."""
_LITERAL = re.compile(r"``([^`]+)``")
_TITLED = re.compile(r"`([^`]+)`_{0,2}")


def plain_doc(text: str) -> str:
    """``text`` with inline reST markup reduced to its words (``:class:`~a.B``` -> B)."""
    text = _ROLE.sub(
        lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), text
    )
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    return _TITLED.sub(r"\1", text)
