"""The one small protocol every medium implements (MEDIUM-2), by its historical name.

The protocol -- :class:`Medium`, :class:`MediumSession`, :class:`GateHost`,
:class:`Execution` and the helpers a medium renders with -- is defined in
:mod:`cantrip.medium`, below the entity that drives it, so the runtime core
depends on the contract and never on the mediums package. Your own medium may
import these names from either module.
"""

from __future__ import annotations

from cantrip.medium import (
    Execution,
    GateHost,
    Medium,
    MediumSession,
    capped_execution,
    cut_off,
    visible_result,
)

__all__ = [
    "Execution",
    "GateHost",
    "Medium",
    "MediumSession",
    "capped_execution",
    "cut_off",
    "visible_result",
]
