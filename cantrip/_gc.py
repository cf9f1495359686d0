"""An opt-in garbage-collector setting for processes that run thousands of entities.

CPython's cyclic collector runs a young-generation pass every 700 net
allocations of container objects, and a full pass whenever the objects
promoted since the last one reach a quarter of the old generation. With
thousands of entities waiting on their LLMs at once, nearly every object a
turn makes (its loom record, its context messages, the coroutines waiting on
the provider) outlives 700 allocations -- the other entities allocate that
much in between -- so it is promoted and then rescanned by each full pass.
In ``bench/concurrency.py`` (10,000 entities x 5 turns at once) collections
took about a third of the run.

A larger young-generation threshold lets most of those objects die by
reference counting before any pass sees them; cyclic garbage is still
collected, only in larger batches. The setting is process-wide, so cantrip
never changes it on its own: a program opts in around the part that runs many
entities, and the previous thresholds come back when the block ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

THROUGHPUT_YOUNG_THRESHOLD = 50_000
"""Young-generation threshold of :func:`gc_for_throughput`: about one turn each
for a couple of thousand entities between collections."""


@contextlib.contextmanager
def gc_for_throughput(young: int = THROUGHPUT_YOUNG_THRESHOLD) -> Iterator[None]:
    """Collect cyclic garbage in larger, rarer batches while the block runs.

    ``young`` replaces the first (young-generation) threshold of
    :func:`gc.set_threshold`; the older generations keep theirs. On exit --
    normal, exception or cancellation -- the thresholds in force before the
    block are restored. Use it around ``trio.run`` or inside async code::

        with cantrip.gc_for_throughput():
            trio.run(run_many_entities)
    """
    if young < 1:
        raise ValueError(f"young-generation threshold must be at least 1, not {young}")
    previous = gc.get_threshold()
    gc.set_threshold(young, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
