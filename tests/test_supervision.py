"""OTP-style supervision: restarts, strategies, intensity, resume from the loom."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio

import cantrip
from cantrip._server import EntityServer
from cantrip._supervisor import ChildSpec, Restart, Strategy, Supervisor, SupervisorEscalation
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from gates import done


class FlakyLLM:
    """Answers done(<last user text>), except that chosen queries hit a runtime bug."""

    name = "flaky"

    def __init__(self, crash_on: set[int]) -> None:
        self.crash_on = crash_on
        self.calls = 0
        self.seen: list[list[Message]] = []

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.calls += 1
        self.seen.append(list(messages))
        await trio.sleep(0)
        if self.calls in self.crash_on:
            raise RuntimeError(f"invariant broken on call {self.calls}")
        last = [m for m in messages if m.role == "user"][-1].content
        return Response(tool_calls=(cantrip.ToolCall(f"c{self.calls}", "done", {"answer": last}),))


def spell_with(llm: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
        loom=cantrip.Loom(),
    )


async def test_crashed_entity_restarts_and_continues_its_thread() -> None:
    llm = FlakyLLM(crash_on={2})
    spell = spell_with(llm)
    server = EntityServer(spell)
    supervisor = Supervisor([server.child_spec()], max_restarts=3, period_s=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        first = await server.ask("first")
        with pytest.raises(RuntimeError, match="invariant broken"):
            await server.ask("second")
        third = await server.ask("third")
        server.close()
    assert (first.result, third.result) == ("first", "third")
    assert server.incarnations == 2 and supervisor.restarts[server.entity_id] == 1
    turns = spell.loom.entity_turns(server.entity_id)
    assert [t.reason for t in turns] == ["done", "crashed", "done"]
    # the second incarnation continued the same thread, from the loom
    assert turns[2].parent_id == turns[1].id and turns[1].parent_id == turns[0].id
    assert turns[2].sequence == 3
    assert any(m.content == "first" for m in llm.seen[-1]), "resumed context lost the first cast"


async def test_restart_intensity_exceeded_escalates() -> None:
    attempts = 0

    async def always_crashes(_: Supervisor) -> None:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("boom")

    supervisor = Supervisor([ChildSpec("doomed", always_crashes)], max_restarts=2, period_s=10)
    with pytest.raises(SupervisorEscalation, match="more than 2 restarts") as info:
        await supervisor.run()
    assert attempts == 3
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_restart_types() -> None:
    runs: dict[str, int] = {"transient_ok": 0, "temporary_crash": 0, "transient_crash": 0}

    async def transient_ok(_: Supervisor) -> None:
        runs["transient_ok"] += 1

    async def temporary_crash(_: Supervisor) -> None:
        runs["temporary_crash"] += 1
        raise ValueError("once")

    async def transient_crash(_: Supervisor) -> None:
        runs["transient_crash"] += 1
        if runs["transient_crash"] == 1:
            raise ValueError("first time only")

    supervisor = Supervisor(
        [
            ChildSpec("transient_ok", transient_ok, Restart.TRANSIENT),
            ChildSpec("temporary_crash", temporary_crash, Restart.TEMPORARY),
            ChildSpec("transient_crash", transient_crash, Restart.TRANSIENT),
        ]
    )
    await supervisor.run()
    assert runs == {"transient_ok": 1, "temporary_crash": 1, "transient_crash": 2}
    assert sorted(child for child, _ in supervisor.crashes) == [
        "temporary_crash",
        "transient_crash",
    ]


async def test_one_for_all_restarts_the_siblings() -> None:
    starts = {"a": 0, "b": 0}

    async def a(_: Supervisor) -> None:
        starts["a"] += 1
        await trio.sleep(0.01)
        if starts["a"] == 1:
            raise RuntimeError("a fails once")

    async def b(sup: Supervisor) -> None:
        starts["b"] += 1
        await trio.sleep(0.05 if starts["b"] > 1 else 10)

    supervisor = Supervisor(
        [ChildSpec("a", a, Restart.TRANSIENT), ChildSpec("b", b, Restart.TRANSIENT)],
        strategy=Strategy.ONE_FOR_ALL,
    )
    with trio.fail_after(5):
        await supervisor.run()
    assert starts == {"a": 2, "b": 2}


async def test_orderly_stop_cancels_after_the_grace_period(autojump_clock: Any) -> None:
    finished_cleanly: list[str] = []

    async def polite(sup: Supervisor) -> None:
        await sup.stopping.wait()
        finished_cleanly.append("polite")

    async def stubborn(_: Supervisor) -> None:
        await trio.sleep(1000)

    supervisor = Supervisor(
        [ChildSpec("polite", polite, Restart.TRANSIENT), ChildSpec("stubborn", stubborn)]
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await trio.sleep(1)
        started = trio.current_time()
        supervisor.stop(grace_s=2)
    assert finished_cleanly == ["polite"]
    assert 1.9 <= trio.current_time() - started <= 2.1


async def test_an_llm_failure_is_not_a_crash_of_the_served_entity() -> None:
    llm = cantrip.ScriptedLLM(
        [
            {"error": {"status": 400, "message": "bad request"}},
            {"tool_calls": [{"gate": "done", "args": {"answer": "still here"}}]},
        ]
    )
    spell = spell_with(llm)
    server = EntityServer(spell)
    supervisor = Supervisor([server.child_spec()], max_restarts=0, period_s=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        with pytest.raises(cantrip.ProviderError, match="bad request"):
            await server.ask("first")
        second = await server.ask("second")
        server.close()
    assert second.result == "still here"
    assert server.incarnations == 1 and not supervisor.crashes
