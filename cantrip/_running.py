"""The entity whose turn is running, for code that runs inside that turn.

A gate or a medium sometimes needs to know on whose behalf it runs (a
delegation gate spawns a child of it; a code medium's ``loom`` object reads its
thread). The entity sets this variable around each turn's execution. It lives
below the entity so that mediums and gates can read it without importing the
runtime above them; they see the entity only through :class:`RunningEntity`.
"""

from __future__ import annotations

import contextvars
from typing import Protocol

from cantrip.loom._loom import Loom


class RunningEntity(Protocol):
    """What code inside a turn may read of the entity running it."""

    @property
    def id(self) -> str: ...
    @property
    def loom(self) -> Loom: ...
    @property
    def leaf(self) -> str | None: ...


CURRENT_ENTITY: contextvars.ContextVar[RunningEntity] = contextvars.ContextVar(
    "cantrip_current_entity"
)
"""The entity on whose behalf a gate or a medium's code is running."""


def running_entity() -> RunningEntity | None:
    """The entity whose turn is running here, or None outside any turn."""
    return CURRENT_ENTITY.get(None)
