"""``"package.module:name"``: an object a spec file names by where it is imported from.

The one reader of such references (an output model, a guardrail's check): the
module is imported, the dotted name looked up in it, and any failure is a
:class:`~cantrip.ConstructionError` naming the reference.
"""

from __future__ import annotations

import importlib
from typing import Any

from cantrip._errors import ConstructionError


def import_reference(reference: str, what: str, shape: str = "package.module:name") -> Any:
    """The object ``reference`` names; ``what`` says what it is for in errors."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConstructionError(f"{what} {reference!r} must look like {shape!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConstructionError(f"{what} {reference!r}: {exc}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConstructionError(
                f"{what} {reference!r}: {module_name} has no {attribute!r}"
            ) from None
    return target
