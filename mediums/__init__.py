"""Mediums: the substrates an entity works in, all behind one protocol.

The medium classes load on first use (``from mediums import JsMedium`` imports
the JavaScript medium then), so importing the protocol costs nothing extra.
Each module also has a default instance (``mediums.js.js``, ...), not
re-exported, so the module names stay modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mediums.base import Execution, GateHost, Medium, MediumSession

if TYPE_CHECKING:
    from mediums.bash import BashMedium
    from mediums.conversation import ConversationMedium
    from mediums.js import JsMedium
    from mediums.python import PythonMedium

_LAZY = {
    "BashMedium": "mediums.bash",
    "ConversationMedium": "mediums.conversation",
    "JsMedium": "mediums.js",
    "PythonMedium": "mediums.python",
}


_EXTRAS = {"JsMedium": ("js", "the js medium"), "PythonMedium": ("python", "the python medium")}
"""The mediums whose engine is an extra (``pip install 'cantrip-runtime[js]'``)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mediums' has no attribute {name!r}")
    if name in _EXTRAS:
        from cantrip.medium import require_extra

        require_extra(*_EXTRAS[name])
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BashMedium",
    "ConversationMedium",
    "Execution",
    "GateHost",
    "JsMedium",
    "Medium",
    "MediumSession",
    "PythonMedium",
]
