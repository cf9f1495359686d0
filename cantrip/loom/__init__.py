"""The loom: turns, their records, the stores that keep them, and their JSONL export.

The chat-format export renders through the entity's prompt context, so it stands
above the loom: ``cantrip.export_chat``.
"""

from cantrip.loom._export import (
    ExportedTurn,
    export_jsonl,
    export_thread_jsonl,
    load_jsonl,
)
from cantrip.loom._loom import Loom
from cantrip.loom._model import CallStatus, EntityRecord, GateCallRecord, Turn, TurnMetadata
from cantrip.loom._stores import JSONLStore, LoomStore, MemoryStore, SQLiteStore, open_store

__all__ = [
    "CallStatus",
    "EntityRecord",
    "ExportedTurn",
    "GateCallRecord",
    "JSONLStore",
    "Loom",
    "LoomStore",
    "MemoryStore",
    "SQLiteStore",
    "Turn",
    "TurnMetadata",
    "export_jsonl",
    "export_thread_jsonl",
    "load_jsonl",
    "open_store",
]
