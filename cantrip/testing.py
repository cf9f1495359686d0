"""Testing your own agents offline: cast a spec with a scripted or replayed LLM and
assert on what happened, with the eval kit's evaluators.

In a test file (or enable the fixtures with ``pytest_plugins = ["cantrip.testing"]``
in ``conftest.py``)::

    from cantrip.testing import cast_spec, expect, scripted

    def test_greets():
        result = cast_spec("agent.toml", "Greet the world.", llm=scripted(
            {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
            {"tool_calls": [{"gate": "done", "args": {"answer": "greeted"}}]},
        ))
        expect(result, result_contains="greeted", gates=["echo", "done"], max_turns=3)

    def test_still_answers_like_the_recording():
        result = cast_spec("agent.toml", "Greet the world.", replay="recordings/agent.jsonl")
        expect(result, reason="done")

A replay needs no key and no network; a changed prompt or gate that makes the
agent ask something new fails the cast with the turn and the difference.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from cantrip._outcome import CastResult
from cantrip.evals import Expect, Outcome, replay_llm
from cantrip.evals._evaluators import pattern_check, plain_checks
from cantrip.llm._contract import LLM
from cantrip.llm._scripted import ScriptedLLM
from cantrip.loom._loom import Loom


def scripted(*responses: Mapping[str, Any]) -> ScriptedLLM:
    """A scripted LLM answering ``responses`` in order (the spec file's form)."""
    return ScriptedLLM(list(responses))


async def cast_spec_async(
    spec: str | Path,
    intent: str,
    *,
    llm: LLM | None = None,
    replay: str | Path | Loom | None = None,
    loom: Loom | None = None,
) -> CastResult:
    """Cast the spec file on ``intent``; ``llm`` or ``replay`` answers instead of the
    spec's own LLM (so no key is read); the cast is recorded in ``loom`` (memory by default)."""
    from cantrip.spec import build_cantrip, load_spec_file

    if llm is not None and replay is not None:
        raise ValueError("give llm or replay, not both")
    path = Path(spec)
    answering = replay_llm(replay) if replay is not None else llm
    spell = build_cantrip(
        load_spec_file(path), base_dir=path.parent, loom=loom or Loom(), llm=answering
    )
    return await spell.cast_async(intent)


def cast_spec(
    spec: str | Path,
    intent: str,
    *,
    llm: LLM | None = None,
    replay: str | Path | Loom | None = None,
    loom: Loom | None = None,
) -> CastResult:
    """:func:`cast_spec_async` from synchronous code (a plain pytest test)."""
    return trio.run(lambda: cast_spec_async(spec, intent, llm=llm, replay=replay, loom=loom))


def expect(result: CastResult, intent: str = "", **expectations: Any) -> None:
    """Assert every expectation (the suite's ``expect`` keys) on ``result``; the
    assertion names each that failed and why. A judge or a ``function`` belongs
    in a suite (``cantrip eval``), not here."""
    wanted = Expect(**expectations)
    if wanted.judge is not None or wanted.function is not None:
        raise ValueError("judge and function expectations run in cantrip eval, not expect()")
    outcome = Outcome(intent, result, result.turns, 0.0)
    checks = plain_checks(wanted, outcome)
    if wanted.result_matches is not None:
        checks.append(pattern_check(wanted.result_matches, outcome))
    failed = [f"{c.name}: {c.message}" for c in checks if not c.passed]
    assert not failed, "; ".join(failed)


@pytest.fixture
def cantrip_loom() -> Iterator[Loom]:
    """A fresh in-memory loom for one test."""
    loom = Loom()
    yield loom
    loom.close()


__all__ = ["cantrip_loom", "cast_spec", "cast_spec_async", "expect", "scripted"]
