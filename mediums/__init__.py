"""Mediums: the substrates an entity works in, all behind one protocol."""

from mediums.base import Execution, GateHost, Medium, MediumSession
from mediums.conversation import ConversationMedium, conversation
from mediums.js import JsMedium, js
from mediums.python import PythonMedium, python

__all__ = [
    "ConversationMedium",
    "Execution",
    "GateHost",
    "JsMedium",
    "Medium",
    "MediumSession",
    "PythonMedium",
    "conversation",
    "js",
    "python",
]
