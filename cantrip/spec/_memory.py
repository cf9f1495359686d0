"""The ``[memory]`` table to :class:`~cantrip.memory.MemorySettings`, problems one line each.

Memory lives in the loom's database, so a spec with memory needs a loom that has one
(``[loom] path`` or ``url``); and a circle naming a memory gate needs memory to work
on. Both are said at load, beside the table's own mistakes, not at the first cast.
"""

from __future__ import annotations

from collections.abc import Sequence

from cantrip._errors import ConstructionError
from cantrip.llm._embed_contract import Embedder
from cantrip.llm._embeddings import embedder_from_config
from cantrip.memory._settings import MemoryBlock, MemorySettings
from cantrip.spec._tables import MemoryEmbedderSpec, MemorySpec

MEMORY_GATES = ("remember", "recall", "forget", "edit_block")


def build_memory(
    spec: MemorySpec | None,
    gate_names: Sequence[str],
    *,
    cantrip_name: str | None,
    has_database: bool,
    problems: list[str],
) -> MemorySettings | None:
    """The settings ``spec`` describes (None: no memory), its problems added to ``problems``."""
    enabled = spec is not None and spec.enabled
    if not enabled:
        used = [name for name in gate_names if name in MEMORY_GATES]
        if used:
            problems.append(
                f"circle.gates: {used[0]!r} works on memory; add a [memory] table "
                "(or leave the gate out)"
            )
        return None
    assert spec is not None
    if not has_database:
        problems.append(
            "memory lives in the loom's database: give [loom] path = '...' or url = '...'"
        )
    blocks: list[MemoryBlock] = []
    for index, block in enumerate(spec.blocks):
        try:
            blocks.append(MemoryBlock(block.label, block.text, block.limit))
        except ConstructionError as exc:
            problems.extend(f"memory.blocks[{index}]: {p}" for p in exc.problems)
    name = spec.name if spec.name is not None else cantrip_name  # the spec's name or stem
    embedder = _build_embedder(spec.embedder, problems) if spec.embedder is not None else None
    try:
        return MemorySettings(
            namespace=tuple(spec.namespace),
            blocks=tuple(blocks),
            recall=spec.recall,
            recall_k=spec.recall_k,
            name=name,
            embedder=embedder,
        )
    except ConstructionError as exc:
        problems.extend(exc.problems)  # each names the memory key it is about
        return None


def _build_embedder(spec: MemoryEmbedderSpec, problems: list[str]) -> Embedder | None:
    """The embedder ``spec`` names, built now so that an unknown provider, one with no
    embeddings endpoint or a missing key is said at load (one line each)."""
    try:
        return embedder_from_config(
            spec.provider,
            spec.model,
            dimensions=spec.dimensions,
            base_url=spec.base_url,
            api_key_env=spec.api_key_env,
            batch_size=spec.batch_size,
            timeout_s=spec.timeout_s,
        )
    except ConstructionError as exc:
        problems.extend(f"memory.embedder: {p}" for p in exc.problems)
        return None
