"""The loom: turns, their records, and the stores that keep them."""

from cantrip.loom._loom import Loom
from cantrip.loom._model import CallStatus, EntityRecord, GateCallRecord, Turn, TurnMetadata
from cantrip.loom._stores import JSONLStore, LoomStore, MemoryStore, SQLiteStore, open_store

__all__ = [
    "CallStatus",
    "EntityRecord",
    "GateCallRecord",
    "JSONLStore",
    "Loom",
    "LoomStore",
    "MemoryStore",
    "SQLiteStore",
    "Turn",
    "TurnMetadata",
    "open_store",
]
