"""Mediums: the substrates an entity works in, all behind one protocol."""

from mediums.base import Execution, GateHost, Medium, MediumSession
from mediums.conversation import ConversationMedium, conversation

__all__ = [
    "ConversationMedium",
    "Execution",
    "GateHost",
    "Medium",
    "MediumSession",
    "conversation",
]
