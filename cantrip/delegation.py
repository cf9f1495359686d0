"""The extension point for delegation gates: spawning child entities from a gate.

``gates.call_agent`` is written against these names only, and so can yours: a
gate that runs inside an entity's turn calls :func:`delegate` (one child) or
:func:`delegate_batch` (several, concurrently; :func:`delegate_batch_outcome` also
names the child each request ran, for the call's record) with requests of the shape
the built-in ``call_agent`` documents. :func:`register_gates` makes gates nameable
in child requests (``gates: ["lookup"]``) beyond the parent's own; the
built-in gates register themselves when the ``gates`` package is imported.
Gates otherwise need only the names in :mod:`cantrip` (``gate``, ``Gate``,
``GateError``, ``GateResult``).
"""

from __future__ import annotations

from cantrip._composition import (
    BatchOutcome,
    ChildOutcome,
    delegate,
    delegate_batch,
    delegate_batch_outcome,
)
from cantrip._gate_names import gate_names, named_gate, register_gates

__all__ = [
    "BatchOutcome",
    "ChildOutcome",
    "delegate",
    "delegate_batch",
    "delegate_batch_outcome",
    "gate_names",
    "named_gate",
    "register_gates",
]
