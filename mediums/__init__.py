"""Mediums: the substrates an entity works in, all behind one protocol.

The classes are exported here; each module also has a default instance
(``mediums.js.js``, ...), not re-exported so the module names stay modules.
"""

from mediums.base import Execution, GateHost, Medium, MediumSession
from mediums.bash import BashMedium
from mediums.conversation import ConversationMedium
from mediums.js import JsMedium
from mediums.python import PythonMedium

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
