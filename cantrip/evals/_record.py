"""What a loom keeps of an eval run: one record per run, beside the cases' casts.

A case's cast says which run and case it was (its first turn's ``eval`` extras:
:data:`~cantrip.evals._runner.EVAL_TAG`), but not how it was judged: the verdict
comes after the cast, from evaluators the loom never sees, and a recorded turn is
never rewritten. So when a run ends, :func:`run_record` writes one more entity
record -- ``cantrip_id = "cantrip.eval"``, no turns -- whose identity holds the run's
summary and every case's verdict (name, repeat, status, the entity of its cast,
reason, tokens, cost). The viewer lists runs from these records alone (entity
records are few; a run's cases are one record), so a 10,000-turn loom is never read
to list them. It is additive: older readers see one more entity with no turns (its
medium is an ordinary one, so whatever reads every entity's medium -- a replay index,
``loom list`` -- reads it as it reads any entity).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cantrip.loom._model import EntityRecord

if TYPE_CHECKING:
    from cantrip.evals._runner import EvalReport

CANTRIP_ID = "cantrip.eval"
"""The ``cantrip_id`` that marks a run's record: no entity runs on it."""
RUN_KEY = "eval_run"
"""The key of the run's data in the record's ``identity``."""


def run_record(report: EvalReport) -> EntityRecord:
    """The record of a finished run: its summary and every case's verdict."""
    summary = report.to_dict()["summary"]
    cases = [
        {
            "name": run.case,
            "repeat": run.repeat,
            "status": run.status,
            "entity_id": run.entity_id,
            "reason": run.reason,
            "why": run.why or None,
            "turns": run.turns,
            "tokens": run.tokens,
            "cost_usd": run.cost_usd,
            "latency_s": round(run.latency_s, 6),
        }
        for run in report.runs
    ]
    data = {
        "run_id": report.run_id,
        "suite": report.suite,
        "spec": report.spec,
        "mode": report.mode,
        "started": report.started,
        "duration_s": round(report.duration_s, 6),
        "repeat": report.repeat,
        "summary": {
            k: summary[k]
            for k in ("cases", "runs", "passed", "failed", "errored", "skipped", "pass_rate")
        }
        | {"tokens": summary["tokens"], "cost_usd": summary["cost_usd"]},
        "cases": cases,
    }
    return EntityRecord(
        entity_id=report.run_id,
        cantrip_id=CANTRIP_ID,
        identity={RUN_KEY: data},
        created_at=report.started,
    )


def is_run_record(record: EntityRecord) -> bool:
    """Whether an entity record is a run's record (the viewer's entity list leaves it out)."""
    return record.cantrip_id == CANTRIP_ID and RUN_KEY in record.identity


def read_run(record: EntityRecord) -> Mapping[str, Any] | None:
    """The run a record holds, or ``None`` when it is an ordinary entity's."""
    if not is_run_record(record):
        return None
    data = record.identity.get(RUN_KEY)
    return data if isinstance(data, Mapping) else None
