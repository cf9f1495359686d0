"""Running on many machines: enqueue casts for ``cantrip worker`` processes.

The public home of the PostgreSQL work queue's client side (the workers are the
``cantrip worker`` command). A module of its own, not a name on the package root,
because it imports the spec loader and the built-in gates, which import the root.
"""

from __future__ import annotations

from cantrip._approval import Decision, Pause, PauseError
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory, spell_from_spec

__all__ = ["Decision", "Dispatcher", "Pause", "PauseError", "spell_from_factory", "spell_from_spec"]
