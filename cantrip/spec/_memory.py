"""The ``[memory]`` table to :class:`~cantrip.memory.MemorySettings`, problems one line each.

Memory lives in the loom's database, so a spec with memory needs a loom that has one
(``[loom] path`` or ``url``); and a circle naming a memory gate needs memory to work
on. Both are said at load, beside the table's own mistakes, not at the first cast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cantrip._cantrip import Cantrip
from cantrip._circle import Circle, circle_problems
from cantrip._errors import ConstructionError
from cantrip._identity import Identity
from cantrip._wards import Ward, WardSet
from cantrip.llm._contract import LLM
from cantrip.llm._embed_contract import Embedder
from cantrip.llm._embeddings import embedder_from_config
from cantrip.memory._consolidate import DEFAULT_PROMPT
from cantrip.memory._settings import Consolidate, MemoryBlock, MemorySettings
from cantrip.spec._tables import MemoryConsolidateSpec, MemoryEmbedderSpec, MemorySpec
from gates import done, forget, recall, remember

MEMORY_GATES = ("remember", "recall", "forget", "edit_block")


def build_memory(
    spec: MemorySpec | None,
    gate_names: Sequence[str],
    *,
    cantrip_name: str | None,
    has_database: bool,
    problems: list[str],
    llm: LLM | None = None,
    named: Mapping[str, LLM] | None = None,
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
    consolidate = None
    if spec.consolidate is not None and spec.consolidate.enabled:
        consolidate = _build_consolidate(spec.consolidate, llm, named or {}, problems)
    try:
        return MemorySettings(
            namespace=tuple(spec.namespace),
            blocks=tuple(blocks),
            recall=spec.recall,
            recall_k=spec.recall_k,
            name=name,
            embedder=embedder,
            consolidate=consolidate,
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


def _build_consolidate(
    spec: MemoryConsolidateSpec,
    llm: LLM | None,
    named: Mapping[str, LLM],
    problems: list[str],
) -> Consolidate | None:
    """The consolidation ``[memory.consolidate]`` describes: a cantrip of its own (its
    LLM, its prompt, the memory gates and ``done``, its wards), each problem one line."""
    where = "memory.consolidate"
    found: list[str] = []
    chosen = llm
    if spec.llm is not None:
        chosen = named.get(spec.llm)
        if chosen is None:
            known = ", ".join(sorted(named)) or "none"
            found.append(f"{where}: llm {spec.llm!r} is not a named llm (known: {known})")
    elif llm is None:
        found.append(f"{where}: needs an llm ([llm], or llm = a name from [llms])")
    wards: list[Ward] = []
    for raw in spec.wards:
        try:
            wards.extend(Ward.parse(raw))
        except ConstructionError as exc:
            found.extend(f"{where}.wards: {p}" for p in exc.problems)
    gates = [done, remember, recall, forget]
    found.extend(f"{where}: {p}" for p in circle_problems(gates, WardSet.resolve(wards)))
    if found or chosen is None:
        problems.extend(found)
        return None
    consolidator = Cantrip(
        llm=chosen,
        identity=Identity(system_prompt=spec.prompt or DEFAULT_PROMPT),
        circle=Circle(gates, wards),
    )
    try:
        return Consolidate(
            consolidator,
            namespace=tuple(spec.namespace) if spec.namespace is not None else None,
            after=spec.after,
        )
    except ConstructionError as exc:
        problems.extend(f"{where}: {p}" for p in exc.problems)
        return None
