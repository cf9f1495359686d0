"""Gates by name: the gates a child request may name beyond its parent's own.

The ``gates`` package registers its built-in gates here when it is imported
(always the case when its delegation gates are in use); composition looks names
up here. So composition never imports the gates package, whose delegation gates
call composition -- the gates stand above the runtime, as users' gates do.
"""

from __future__ import annotations

from cantrip._gate import Gate

_BY_NAME: dict[str, Gate] = {}
_CANONICAL: dict[str, Gate] = {}


def register_gates(*gates: Gate) -> None:
    """Make gates nameable in child requests (``gates: ["echo"]``), under their
    names and aliases. A later registration of a name replaces the earlier one."""
    for g in gates:
        _CANONICAL[g.name] = g
        for name in (g.name, *g.aliases):
            _BY_NAME[name] = g


def named_gate(name: str) -> Gate | None:
    """The registered gate answering to ``name`` (a name or an alias), if any."""
    return _BY_NAME.get(name)


def gate_names() -> list[str]:
    """The registered gates' own names, sorted (aliases left out)."""
    return sorted(_CANONICAL)
