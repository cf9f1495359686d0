"""The runtime core: the entity and its parts, one role each.

:class:`Entity` (:mod:`._entity`) is the face: its constructors and public
methods. Beneath it, each part has one job: :mod:`._state` (the entity's data,
which the parts read), :mod:`._loop` (one cast, turn by turn),
:mod:`._conclude` (whether an executed turn ends the cast),
:mod:`._recording` (building each turn and writing it to the loom),
:mod:`._cast` (a cast's totals and result), :mod:`._pauses` (humans in the
loop), :mod:`._host` (the gate host a turn's medium calls),
:mod:`._steering` (messages to a running cast) and :mod:`._budget` (budgets
counted over the entity tree). The cost ward is with the other
wards (:mod:`cantrip._wards`). The core imports only foundations: errors,
values, the LLM contract, the loom, the medium contract, the circle, context,
journal, replay and approvals -- never tracing, mediums or a protocol; the
cantrip above installs what those need (its trace sink is the entity's event sink).
"""

from cantrip._core._entity import CURRENT_ENTITY, Entity
from cantrip._core._pauses import PauseHandler
from cantrip._core._state import EntitySetup, Spell

__all__ = ["CURRENT_ENTITY", "Entity", "EntitySetup", "PauseHandler", "Spell"]
