"""Eval runs in the viewer: the runs a loom records, one run's cases, two runs paired.

``cantrip eval --loom`` (or ``run_suite(loom=...)``) writes, beside the cases' casts,
one record per run holding its verdicts (:mod:`cantrip.evals._record`). These reads
use those records only -- the loom's entity records, or one of them by id: a query
each on SQLite and PostgreSQL -- so listing runs or a run's cases never reads a
turn, however long the casts. A case names the entity of its cast, which the page
opens as a timeline (``/api/entities/{id}/timeline``) or hands to Compare.

Every list is paged (``offset``, ``limit``, ``total``); a run's cases filter by
``status`` (one or more of passed, failed, errored, skipped, comma-separated) and
``name`` (a case-insensitive part of the case's name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cantrip.evals._record import is_run_record, read_run
from cantrip.llm._contract import plain_json
from cantrip.loom._loom import Loom
from cantrip.protocols.viewer._errors import ViewerError

__all__ = ["eval_cases", "eval_pairs", "eval_runs", "is_run_record"]

STATUSES = ("passed", "failed", "errored", "skipped")


def _head(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run without its cases: what the list of runs shows."""
    head = {k: plain_json(v) for k, v in run.items() if k != "cases"}
    summary = head.get("summary") or {}
    for status in STATUSES:
        head[status] = summary.get(status, 0)
    return head


def _page(items: Sequence[Any], offset: int, limit: int, **more: Any) -> dict[str, Any]:
    return {
        "total": len(items),
        "offset": offset,
        "limit": limit,
        **more,
        "items": list(items[offset : offset + limit]),
    }


def eval_runs(loom: Loom, offset: int, limit: int) -> dict[str, Any]:
    """The runs the loom records, newest first, each with its pass/fail counts."""
    runs = [
        (position, run)
        for position, record in enumerate(loom.entities.values())
        if (run := read_run(record)) is not None
    ]
    runs.sort(key=lambda item: (str(item[1].get("started", "")), item[0]), reverse=True)
    return _page([_head(run) for _, run in runs], offset, limit)


def _run(loom: Loom, run_id: str) -> Mapping[str, Any]:
    run = read_run(loom.entity(run_id)) if loom.has_entity(run_id) else None
    if run is None:
        raise ViewerError(404, "unknown_run", f"no eval run {run_id!r} in this loom")
    return run


def _filters(query: Mapping[str, Sequence[str]]) -> tuple[set[str], str]:
    wanted: set[str] = set()
    for value in query.get("status") or ():
        wanted.update(s.strip() for s in value.split(",") if s.strip())
    unknown = sorted(wanted - set(STATUSES))
    if unknown:
        raise ViewerError(
            400,
            "bad_request",
            f"unknown status {', '.join(unknown)}: use {', '.join(STATUSES)}",
        )
    return wanted, (query.get("name") or [""])[-1].strip().lower()


def eval_cases(
    loom: Loom, run_id: str, query: Mapping[str, Sequence[str]], offset: int, limit: int
) -> dict[str, Any]:
    """A page of one run's cases (in suite order, then repeat), filtered; ``counts``
    are the whole run's, ``total`` the filtered list's."""
    run = _run(loom, run_id)
    wanted, needle = _filters(query)
    cases = [plain_json(case) for case in run.get("cases") or ()]
    chosen = [
        case
        for case in cases
        if (not wanted or case.get("status") in wanted)
        and (not needle or needle in str(case.get("name", "")).lower())
    ]
    counts = {s: sum(1 for c in cases if c.get("status") == s) for s in STATUSES}
    return _page(chosen, offset, limit, run=_head(run), counts=counts)


def eval_pairs(
    loom: Loom, a: str, b: str, query: Mapping[str, Sequence[str]], offset: int, limit: int
) -> dict[str, Any]:
    """Two runs side by side: their cases paired by name and repeat (in ``a``'s order,
    then the cases only ``b`` has), each pair's casts ready for Compare; ``changed``
    when the two verdicts differ. ``changed=1`` keeps only those."""
    run_a, run_b = _run(loom, a), _run(loom, b)
    keyed_b = {(c.get("name"), c.get("repeat")): plain_json(c) for c in run_b.get("cases") or ()}
    pairs: list[dict[str, Any]] = []
    for case in run_a.get("cases") or ():
        key = (case.get("name"), case.get("repeat"))
        pairs.append(_pair(key, plain_json(case), keyed_b.pop(key, None)))
    pairs.extend(_pair(key, None, case) for key, case in keyed_b.items())
    changed = sum(1 for p in pairs if p["changed"])
    if (query.get("changed") or [""])[-1] in ("1", "true"):
        pairs = [p for p in pairs if p["changed"]]
    return _page(pairs, offset, limit, a=_head(run_a), b=_head(run_b), changed=changed)


def _pair(key: tuple[Any, Any], a: Any, b: Any) -> dict[str, Any]:
    status_a = a.get("status") if a else None
    status_b = b.get("status") if b else None
    return {
        "name": key[0],
        "repeat": key[1],
        "a": a,
        "b": b,
        "changed": status_a != status_b,
    }
