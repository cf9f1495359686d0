"""``Loom.release`` forgets an entity's fence and the fences its children inherited,
and nothing of another lease's: by an index of the holders per lease entity since
issue 46.4 (it used to look at every fence the process held, ~100 us a cast for a
worker holding 1,000)."""

from __future__ import annotations

import pytest

from cantrip.loom import Loom
from cantrip.loom._fence import Fence
from cantrip.loom._loom import LoomError
from cantrip.loom._model import EntityRecord


def test_release_forgets_the_entity_and_its_children_and_keeps_other_leases() -> None:
    loom = Loom()
    loom.hold("root-a", Fence("root-a", "w1", 1))
    loom.hold("root-b", Fence("root-b", "w1", 1))
    loom.register_entity(EntityRecord(entity_id="root-a", cantrip_id="c"))
    loom.register_entity(
        EntityRecord(entity_id="child-a", cantrip_id="c", parent_entity_id="root-a")
    )
    loom.register_entity(
        EntityRecord(entity_id="child-b", cantrip_id="c", parent_entity_id="root-b")
    )
    with pytest.raises(LoomError, match="held already"):  # child-a inherited root-a's fence
        loom.hold("child-a", Fence("child-a", "w2", 2))

    loom.release("root-a")

    loom.hold("root-a", Fence("root-a", "w2", 2))  # forgotten: another fence is taken
    loom.hold("child-a", Fence("root-a", "w2", 2))
    with pytest.raises(LoomError, match="held already"):
        loom.hold("root-b", Fence("root-b", "w2", 2))
    with pytest.raises(LoomError, match="held already"):
        loom.hold("child-b", Fence("root-b", "w2", 2))
    loom.release("root-a")  # the second holding is released as the first was
    loom.hold("child-a", Fence("child-a", "w3", 3))
    loom.release("child-a")
    loom.release("child-a")  # not held: nothing to do
    loom.hold("child-b", Fence("root-b", "w1", 1))  # the same fence: still held as it was
