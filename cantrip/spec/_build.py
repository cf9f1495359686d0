"""A spec document to a :class:`~cantrip.Cantrip`, every problem reported at once.

:func:`build_cantrip` builds each part the document describes -- its LLMs
(:mod:`cantrip.spec._llm`), identity, circle (:mod:`cantrip.spec._circle`; the MCP
servers and A2A agents of :mod:`cantrip.spec._providers`), wards, retry, loom, folding
and output -- collecting the problems of all of them, and raises one
:class:`~cantrip.ConstructionError` naming every one before anything is opened.

Declarative construction is strict about the medium (MEDIUM-1): a spec file must say
``medium = "..."``. (The Python API defaults to conversation.)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cantrip._approval import ApprovalPolicy
from cantrip._cantrip import Cantrip, cantrip_problems
from cantrip._circle import Circle, circle_problems
from cantrip._errors import ConstructionError
from cantrip._folding import FoldingPolicy, LLMFolder
from cantrip._identity import Identity
from cantrip._output import OutputSchema
from cantrip._wards import Ward, WardSet
from cantrip.llm._contract import LLM
from cantrip.llm._retry import RetryingLLM, RetryPolicy
from cantrip.loom._loom import Loom
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._stores import SQLiteStore
from cantrip.spec._circle import (
    build_gate,
    protected_files,
    resolve_medium,
    spec_path,
    with_isolation,
    with_loom,
)
from cantrip.spec._guardrails import guardrails_from_tables
from cantrip.spec._llm import build_llm
from cantrip.spec._memory import build_memory
from cantrip.spec._providers import agents_from_tables, circle_servers
from cantrip.spec._tables import (
    CircleSpec,
    FoldingSpec,
    IdentitySpec,
    OutputSpec,
    RetrySpec,
    SpecDocument,
)


def build_cantrip(
    doc: SpecDocument,
    *,
    strict_medium: bool = True,
    base_dir: Path | None = None,
    fs_root: Path | None = None,
    llms: Mapping[str, LLM] | None = None,
    loom: Loom | None = None,
    llm: LLM | None = None,
    known_problems: list[str] | None = None,
    memory_given: bool = False,
) -> Cantrip:
    """Construct the cantrip a document describes, reporting every problem at once.

    ``base_dir`` anchors relative paths (the spec file's folder) and is the
    default for path dependencies left unset (``read``'s root). ``fs_root``,
    when given, is a sandbox folder in which absolute paths are re-rooted (the
    conformance runner's virtual filesystem). ``llms`` adds named LLMs built
    elsewhere (tests); named LLMs of the document are built here. ``llm``
    swaps in an already-built LLM for the document's own (spec 2.2).
    ``known_problems`` were found before (the file's keys): reported first, with
    whatever the build finds. ``memory_given``: the caller gives the memory its store
    (an eval run gives each run of a case an empty one: ``MemorySettings.store``), so
    the loom need not be a database.
    """
    problems: list[str] = list(known_problems or ())
    if llm is None and doc.llm is not None:
        llm = build_llm(doc.llm, problems, "llm")
    named: dict[str, LLM] = dict(llms or {})
    for key, spec in doc.llms.items():
        built = build_llm(spec, problems, f"llms.{key}")
        if built is not None:
            named[spec.name or key] = built
    identity = _build_identity(doc.identity)
    circle_spec = doc.circle or CircleSpec()
    medium = resolve_medium(circle_spec, strict_medium, problems)
    if medium is not None and circle_spec.expose_loom is not None:
        medium = with_loom(medium, circle_spec.expose_loom, problems)
    if medium is not None and (circle_spec.isolation or circle_spec.network is not None):
        medium = with_isolation(medium, circle_spec, problems)
    loom_file = getattr(loom.store, "path", None) if loom is not None else None
    if loom is None and doc.loom and doc.loom.path:
        loom_file = spec_path(doc.loom.path, base_dir)
    hidden = protected_files(doc._source, loom_file)
    gate_list = [
        g
        for g in (
            build_gate(spec, problems, base_dir=base_dir, fs_root=fs_root, hidden=hidden)
            for spec in circle_spec.gates
        )
        if g is not None
    ]
    wards: list[Ward] = []
    for raw in circle_spec.wards:
        try:
            wards.extend(Ward.parse(raw))
        except ConstructionError as exc:
            problems.extend(exc.problems)
    resolved = WardSet.resolve(wards)
    if resolved.max_depth == 0:
        gate_list = [g for g in gate_list if not g.delegates]
    problems.extend(circle_problems(gate_list, resolved))
    servers = circle_servers(circle_spec.mcp, base_dir, problems)
    try:
        agents = agents_from_tables(circle_spec.a2a)
    except ConstructionError as exc:
        problems.extend(exc.problems)
        agents = ()
    rails = guardrails_from_tables(circle_spec.guardrails, problems, llm=llm, named=named)
    llm_reported = doc.llm is not None and llm is None  # its own problems say why
    problems.extend(
        p
        for p in cantrip_problems(llm, identity, True)
        if "circle" not in p and not (llm_reported and "requires an llm" in p)
    )
    output = _build_output(doc.output, problems) if doc.output is not None else None
    name = doc.name or (doc._source.stem if doc._source is not None else None)
    memory = build_memory(
        doc.memory,
        [g.name for g in gate_list],
        cantrip_name=name,
        has_database=memory_given or _has_database(doc, loom),
        problems=problems,
        llm=llm,
        named=named,
    )
    if problems:
        raise ConstructionError(dedupe(problems))
    assert llm is not None and medium is not None
    approval = (
        ApprovalPolicy(circle_spec.approve, timeout_s=circle_spec.approval_timeout_s)
        if circle_spec.approve
        else None
    )
    circle = Circle(
        gate_list,
        wards,
        medium,
        approval=approval,
        providers=(*servers, *agents),
        guardrails=rails,
    )
    retry = _build_retry(doc.retry)
    if loom is None:
        if doc.loom and doc.loom.url:
            loom = Loom.open(doc.loom.url)
        else:
            loom = (
                Loom.open(spec_path(doc.loom.path, base_dir), journal=doc.loom.journal)
                if doc.loom and doc.loom.path
                else Loom()
            )
    folding = _build_folding(doc.folding, llm, named) if doc.folding is not None else None
    return Cantrip(
        llm=llm,
        identity=identity,
        circle=circle,
        loom=loom,
        retry=retry,
        llms=named,
        folding=folding,
        output=output,
        name=name,
        memory=memory,
    )


def _has_database(doc: SpecDocument, loom: Loom | None) -> bool:
    """Whether the cantrip's loom will be a database (SQLite or PostgreSQL) memory can live in."""
    if loom is not None:
        return isinstance(loom.store, SQLiteStore | PostgresStore)
    return doc.loom is not None and bool(doc.loom.path or doc.loom.url)


def _build_output(spec: OutputSpec, problems: list[str]) -> OutputSchema | None:
    if (spec.output_schema is None) == (spec.model is None):
        problems.append("output: give exactly one of schema = {...} or model = 'module:Class'")
        return None
    try:
        if spec.model is not None:
            return OutputSchema.from_reference(spec.model)
        assert spec.output_schema is not None
        return OutputSchema.from_json_schema(spec.output_schema)
    except ConstructionError as exc:
        problems.extend(exc.problems)
        return None


def _build_folding(spec: FoldingSpec, llm: LLM, named: Mapping[str, LLM]) -> FoldingPolicy:
    fields = spec.model_dump(exclude={"folder", "folder_llm"})
    if spec.folder == "template":
        if spec.folder_llm is not None:
            raise ConstructionError('folding: folder_llm needs folder = "llm"')
        return FoldingPolicy(**fields)
    summarizer = llm
    if spec.folder_llm is not None:
        if spec.folder_llm not in named:
            known = ", ".join(sorted(named)) or "none"
            raise ConstructionError(
                f"folding: folder_llm {spec.folder_llm!r} is not a named llm (known: {known})"
            )
        summarizer = named[spec.folder_llm]
    return FoldingPolicy(**fields, folder=LLMFolder(RetryingLLM(summarizer)))


def _build_identity(spec: IdentitySpec | None) -> Identity:
    if spec is None:
        return Identity()
    return Identity(
        system_prompt=spec.system_prompt,
        temperature=spec.temperature,
        top_p=spec.top_p,
        max_tokens=spec.max_tokens,
        stop=tuple(spec.stop),
        seed=spec.seed,
        tool_choice=spec.tool_choice,
        extra=(
            {**spec.extra, "reasoning_effort": spec.reasoning_effort}
            if spec.reasoning_effort is not None
            else spec.extra
        ),
    )


def _build_retry(spec: RetrySpec | None) -> RetryPolicy:
    if spec is None:
        return RetryPolicy()
    return RetryPolicy(
        max_retries=spec.max_retries,
        retryable_status_codes=frozenset(spec.retryable_status_codes),
        base_delay=spec.base_delay,
        max_delay=spec.max_delay,
    )


def dedupe(items: list[str]) -> list[str]:
    """Problems in the order they were found, each once (two parts may find the same)."""
    return list(dict.fromkeys(items))
