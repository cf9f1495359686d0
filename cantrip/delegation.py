"""The extension point for delegation gates: spawning child entities from a gate.

``gates.call_agent`` is written against these names only, and so can yours: a
gate that runs inside an entity's turn calls :func:`delegate` (one child) or
:func:`delegate_batch` (several, concurrently) with requests of the shape the
built-in ``call_agent`` documents. :func:`register_gates` makes gates nameable
in child requests (``gates: ["lookup"]``) beyond the parent's own; the
built-in gates register themselves when the ``gates`` package is imported.
Gates otherwise need only the names in :mod:`cantrip` (``gate``, ``Gate``,
``GateError``, ``GateResult``).
"""

from __future__ import annotations

from cantrip._composition import ChildOutcome, delegate, delegate_batch
from cantrip._gate_names import gate_names, named_gate, register_gates

__all__ = [
    "ChildOutcome",
    "delegate",
    "delegate_batch",
    "gate_names",
    "named_gate",
    "register_gates",
]
