"""A ``call_agent`` child that pauses, over AG-UI (issue 44, SPEC AGUI-6).

A child (at any depth) waits for its answer in place, inside its parent's delegation
call: the prompt keeps running. The AG-UI run ends there anyway, with ``RUN_FINISHED``
``interrupt`` for the child's pause (its ``subagentRunId`` on the interrupt, the child
closed ``suspended``), and the next run resuming that interrupt answers the child and
tells the rest of the same prompt: the child's events after its pause, its end, the
parent's later events and the prompt's end. Before, the run sent nothing for the pause
and idled on heartbeats until the client gave up -- whose hang-up then cancelled the
prompt.

Every stream is read off a live server, each event held to the 1.0 JSON Schema (the
autouse fixture) and each stream checked by ``ag-ui-validate`` (``agui``); the official
JavaScript client runs the round trip too (``test_agui_client.py``'s harness)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from test_agui import agui, run_input, serving, types
from test_agui_client import js_client
from test_agui_client import serving as serving_with_token

import cantrip
from gates import ask_user, call_agent, call_agent_batch, done

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop

LAUNCHED: list[str] = []
"""Every target ``launch`` ran at (a gate runs at most once per answer)."""


@cantrip.gate(requires_approval=True)
def launch(target: str) -> str:
    """Something a person must approve first."""
    LAUNCHED.append(target)
    return f"launched at {target}"


def delegating(child: list[dict[str, Any]], grandchild: list[dict[str, Any]] | None = None) -> Any:
    """A session entity that delegates once (to ``kid``, whose script is ``child``)
    and then answers "ok"; ``grandchild``: the kid's own child's script (``grandkid``)."""
    llms = {"kid": cantrip.ScriptedLLM(child)}
    if grandchild is not None:
        llms["grandkid"] = cantrip.ScriptedLLM(grandchild)
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {
                    "content": "asking the kid",
                    "tool_calls": [
                        {"gate": "call_agent", "args": {"intent": "handle it", "llm": "kid"}}
                    ],
                },
                {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, call_agent, launch, ask_user], [cantrip.max_turns(5), cantrip.max_depth(2)]
        ),
        loom=cantrip.Loom(),
    ).with_(llms=llms)


KID_LAUNCHES = [
    {"tool_calls": [{"gate": "launch", "args": {"target": "moon"}}]},
    {"content": "the kid is done"},
]


def only(events: list[dict[str, Any]], kind: str, **where: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind and all(e.get(k) == v for k, v in where.items())]


def index(events: list[dict[str, Any]], kind: str, **where: Any) -> int:
    (found,) = [
        i
        for i, e in enumerate(events)
        if e["type"] == kind and all(e.get(k) == v for k, v in where.items())
    ]
    return found


async def session_of(base: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The session the run ran on, as the HTTP API says it now."""
    sid = events[1]["snapshot"]["cantrip"]["session_id"]
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        info = (await http.get(f"/sessions/{sid}")).json()
        pending = (await http.get(f"/sessions/{sid}/pending")).json()
    return {"info": info, "pending": pending}


async def paused_run(base: str, thread: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run that meets the child's pause, and its one interrupt."""
    with trio.fail_after(15):  # before: no end at all (heartbeats until the client gave up)
        answer, events = await agui(base, run_input(thread, "go"))
    assert answer.status_code == 200
    assert events[-1]["type"] == "RUN_FINISHED", types(events)
    outcome = events[-1]["outcome"]
    assert outcome["type"] == "interrupt", outcome
    (interrupt,) = outcome["interrupts"]
    return events, interrupt


async def test_a_childs_approval_is_an_interrupt_and_the_resume_tells_the_rest() -> None:
    LAUNCHED.clear()
    async with serving(delegating(KID_LAUNCHES)) as base:
        paused, interrupt = await paused_run(base, "t-child-approve")
        (started,) = only(paused, "SUBAGENT_STARTED")
        kid = started["subagentRunId"]
        # attributed to the child: its sub-agent run, its own tool call
        assert interrupt["subagentRunId"] == kid
        assert interrupt["reason"] == "approval" and interrupt["metadata"]["gate"] == "launch"
        (call,) = only(paused, "TOOL_CALL_START", toolCallName="launch")
        assert call["subagentRunId"] == kid and interrupt["toolCallId"] == call["toolCallId"]
        # the child's segment of the run closes suspended, owning the interrupt
        (finished,) = only(paused, "SUBAGENT_FINISHED")
        assert finished["outcome"] == {"type": "suspended", "interruptIds": [interrupt["id"]]}
        assert "SUBAGENT_ERROR" not in types(paused) and "TOOL_CALL_RESULT" not in types(paused)
        state = paused[-3]["snapshot"]["cantrip"]
        assert state["running"] is True and [p["pause_id"] for p in state["pending"]] == [
            interrupt["id"]
        ]
        # the prompt still runs, the child waiting in place: nothing was cancelled
        now = await session_of(base, paused)
        assert now["info"]["running"] is True
        assert [p["pause_id"] for p in now["pending"]["pending"]] == [interrupt["id"]]
        assert LAUNCHED == []

        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-child-approve", None, resume=resume))
        _, twice = await agui(base, run_input("t-child-approve", None, resume=resume))
    assert LAUNCHED == ["moon"], "the gate ran once"
    assert resumed[-1]["type"] == "RUN_FINISHED" and resumed[-1]["outcome"] == {"type": "success"}
    assert resumed[-1]["result"] == "ok"
    # the child's events after its pause, with its subagentRunId, then its end ...
    (again,) = only(resumed, "SUBAGENT_STARTED")
    assert again["subagentRunId"] == kid
    assert again["parentToolCallId"] == started["parentToolCallId"]
    assert again.get("description") == "handle it"
    (result,) = only(resumed, "TOOL_CALL_RESULT", toolCallId=interrupt["toolCallId"])
    assert result["subagentRunId"] == kid and result["content"] == "launched at moon"
    said = "".join(e["delta"] for e in only(resumed, "TEXT_MESSAGE_CONTENT", subagentRunId=kid))
    assert said == "the kid is done"
    done_at = index(resumed, "SUBAGENT_FINISHED", subagentRunId=kid)
    assert resumed[done_at]["outcome"] == {"type": "success"}
    # ... then the parent's: the delegation's result, and its answer
    delegation = index(resumed, "TOOL_CALL_RESULT", toolCallId=started["parentToolCallId"])
    assert "subagentRunId" not in resumed[delegation]
    assert index(resumed, "TOOL_CALL_RESULT", toolCallId=interrupt["toolCallId"]) < done_at
    assert done_at < delegation
    assert twice[-1]["type"] == "RUN_ERROR" and twice[-1]["code"] == "bad_resume"
    assert "TOOL_CALL_RESULT" not in types(twice)


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"status": "cancelled"}, "denied by the user: cancelled by the user"),
        ({"status": "resolved", "payload": False}, "denied by the user: no reason given"),
    ],
)
async def test_a_childs_denied_interrupt_reaches_it_as_a_denial(
    entry: dict[str, Any], said: str
) -> None:
    LAUNCHED.clear()
    async with serving(delegating(KID_LAUNCHES)) as base:
        _, interrupt = await paused_run(base, "t-child-deny")
        resume = [{"interruptId": interrupt["id"], **entry}]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-child-deny", None, resume=resume))
    assert LAUNCHED == []
    (result,) = only(resumed, "TOOL_CALL_RESULT", toolCallId=interrupt["toolCallId"])
    assert result["content"] == said
    assert result["subagentRunId"] == interrupt["subagentRunId"]
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"] == "ok"


async def test_a_childs_question_is_an_interrupt_answered_with_text() -> None:
    kid = [
        {"tool_calls": [{"gate": "ask_user", "args": {"question": "Which colour?"}}]},
        {"content": "blue it is"},
    ]
    async with serving(delegating(kid)) as base:
        paused, interrupt = await paused_run(base, "t-child-ask")
        assert interrupt["reason"] == "question" and interrupt["message"] == "Which colour?"
        assert interrupt["subagentRunId"] == only(paused, "SUBAGENT_STARTED")[0]["subagentRunId"]
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "blue"}]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-child-ask", None, resume=resume))
    (result,) = only(resumed, "TOOL_CALL_RESULT", toolCallId=interrupt["toolCallId"])
    assert result["content"] == "blue" and result["subagentRunId"] == interrupt["subagentRunId"]
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"] == "ok"


async def test_a_grandchilds_pause_is_attributed_to_it_and_resumed_through_its_parent() -> None:
    LAUNCHED.clear()
    kid = [
        {
            "tool_calls": [
                {"gate": "call_agent", "args": {"intent": "go deeper", "llm": "grandkid"}}
            ]
        },
        {"content": "the kid is done"},
    ]
    grandkid = [
        {"tool_calls": [{"gate": "launch", "args": {"target": "mars"}}]},
        {"content": "the grandkid is done"},
    ]
    async with serving(delegating(kid, grandkid)) as base:
        paused, interrupt = await paused_run(base, "t-grandchild")
        first, second = only(paused, "SUBAGENT_STARTED")
        assert second["parentSubagentRunId"] == first["subagentRunId"]
        assert interrupt["subagentRunId"] == second["subagentRunId"]
        closed = {e["subagentRunId"]: e["outcome"] for e in only(paused, "SUBAGENT_FINISHED")}
        assert closed == {
            second["subagentRunId"]: {"type": "suspended", "interruptIds": [interrupt["id"]]},
            first["subagentRunId"]: {"type": "suspended"},  # it waits on its child
        }
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-grandchild", None, resume=resume))
    assert LAUNCHED == ["mars"]
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"] == "ok"
    again = only(resumed, "SUBAGENT_STARTED")
    assert [e["subagentRunId"] for e in again] == [first["subagentRunId"], second["subagentRunId"]]
    assert again[1]["parentSubagentRunId"] == first["subagentRunId"]
    assert again[1]["parentToolCallId"] == second["parentToolCallId"]
    (result,) = only(resumed, "TOOL_CALL_RESULT", toolCallId=interrupt["toolCallId"])
    assert result["subagentRunId"] == second["subagentRunId"]
    grandkid_done = index(resumed, "SUBAGENT_FINISHED", subagentRunId=second["subagentRunId"])
    kid_done = index(resumed, "SUBAGENT_FINISHED", subagentRunId=first["subagentRunId"])
    assert (
        grandkid_done
        < kid_done
        < index(resumed, "TOOL_CALL_RESULT", toolCallId=first["parentToolCallId"])
    )


async def test_a_bad_resume_of_a_childs_interrupt_runs_nothing_and_the_child_still_waits() -> None:
    LAUNCHED.clear()
    async with serving(delegating(KID_LAUNCHES)) as base:
        paused, interrupt = await paused_run(base, "t-child-bad")
        unknown = [{"interruptId": "pause-nope", "status": "resolved", "payload": True}]
        _, first = await agui(base, run_input("t-child-bad", None, resume=unknown))
        wrong_kind = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "yes"}]
        _, second = await agui(base, run_input("t-child-bad", None, resume=wrong_kind))
        for refused in (first, second):
            assert refused[-1]["type"] == "RUN_ERROR" and refused[-1]["code"] == "bad_resume"
            assert "TOOL_CALL_RESULT" not in types(refused)
        now = await session_of(base, paused)
        assert now["info"]["running"] is True and len(now["pending"]["pending"]) == 1
        assert LAUNCHED == []
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-child-bad", None, resume=resume))
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"] == "ok"
    assert LAUNCHED == ["moon"]


async def test_nobody_resumes_the_prompt_waits_and_the_cancel_route_ends_it() -> None:
    LAUNCHED.clear()
    async with serving(delegating(KID_LAUNCHES)) as base:
        paused, interrupt = await paused_run(base, "t-child-left")
        sid = paused[1]["snapshot"]["cantrip"]["session_id"]
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            cancelled = (await http.post(f"/sessions/{sid}/cancel")).json()
            assert cancelled["cancelled"] is True
            with trio.fail_after(10):
                while (await http.get(f"/sessions/{sid}")).json()["running"]:
                    await trio.sleep(0.02)
            thread = (await http.get(f"/sessions/{sid}/thread")).json()
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        _, late = await agui(base, run_input("t-child-left", None, resume=resume))
    assert thread["turns"][-1]["reason"] == "cancelled"
    assert late[-1]["type"] == "RUN_ERROR" and late[-1]["code"] == "bad_resume"
    assert LAUNCHED == []


async def test_the_official_js_client_resumes_a_childs_interrupt() -> None:
    """``@ag-ui/client`` 1.0.0 takes both runs (its verifier checks each: sub-agents
    closed before ``RUN_FINISHED``, one announced again in the run that resumes it),
    holds the interrupt with its ``subagentRunId`` and answers it."""
    LAUNCHED.clear()
    async with serving_with_token(delegating(KID_LAUNCHES)) as base:
        report = await js_client(base, "approve")
    paused, resumed = report["runs"]
    assert paused["error"] is None and paused["finished"]["outcome"] == "interrupt", paused
    (interrupt,) = paused["finished"]["interrupts"]
    kid = only(paused["events"], "SUBAGENT_STARTED")[0]["subagentRunId"]
    assert interrupt["subagentRunId"] == kid
    assert resumed["error"] is None and resumed["finished"]["outcome"] == "success", resumed
    assert resumed["result"] == "ok"
    assert report["pendingInterrupts"] == []
    assert LAUNCHED == ["moon"]


def batch_of_two() -> Any:
    """A session entity whose one ``call_agent_batch`` runs two children that each
    ask to ``launch``, then answers "both"."""
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {
                    "tool_calls": [
                        {
                            "gate": "call_agent_batch",
                            "args": {
                                "requests": [
                                    {"intent": "one", "llm": "kid"},
                                    {"intent": "two", "llm": "kid"},
                                ]
                            },
                        }
                    ]
                },
                {"tool_calls": [{"gate": "done", "args": {"answer": "both"}}]},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, call_agent_batch, launch], [cantrip.max_turns(5), cantrip.max_depth(1)]
        ),
        loom=cantrip.Loom(),
    ).with_(
        llms={
            "kid": cantrip.ScriptedLLM(
                [
                    {"tool_calls": [{"gate": "launch", "args": {"target": "moon"}}]},
                    {"tool_calls": [{"gate": "launch", "args": {"target": "mars"}}]},
                    {"content": "a kid is done"},
                    {"content": "a kid is done"},
                ]
            )
        }
    )


async def test_two_children_of_a_batch_that_pause_are_resumed_one_run_each() -> None:
    """Two children of one ``call_agent_batch`` ask at once: each run ends at the next
    pause told (the other child waits too), each resume answers one and tells what
    came after the one before, and the last run ends the prompt -- each gate once."""
    LAUNCHED.clear()
    async with serving(batch_of_two()) as base:
        runs = [(await paused_run(base, "t-batch"))[0]]
        while runs[-1][-1]["outcome"]["type"] == "interrupt":
            assert len(runs) <= 3, [types(r) for r in runs]
            (interrupt,) = runs[-1][-1]["outcome"]["interrupts"]
            resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
            with trio.fail_after(15):
                _, resumed = await agui(base, run_input("t-batch", None, resume=resume))
            assert resumed[-1]["type"] == "RUN_FINISHED", types(resumed)
            runs.append(resumed)
    assert sorted(LAUNCHED) == ["mars", "moon"]
    assert len(runs) == 3 and runs[-1][-1]["result"] == "both"
    asked = [r[-1]["outcome"]["interrupts"][0] for r in runs[:2]]
    kids = {e["subagentRunId"] for r in runs for e in only(r, "SUBAGENT_STARTED")}
    assert len(kids) == 2 and {i["subagentRunId"] for i in asked} == kids
    # each run that ends waiting shows its waiting sub-agent closed suspended
    for run, interrupt in zip(runs[:2], asked, strict=True):
        (waits,) = only(run, "SUBAGENT_FINISHED", subagentRunId=interrupt["subagentRunId"])
        assert waits["outcome"] == {"type": "suspended", "interruptIds": [interrupt["id"]]}
    results = [e for r in runs for e in only(r, "TOOL_CALL_RESULT") if e.get("subagentRunId")]
    assert sorted(e["content"] for e in results) == ["launched at mars", "launched at moon"]


async def test_a_resume_run_whose_client_hangs_up_cancels_the_prompt() -> None:
    """The run that resumes a child's interrupt follows the prompt as its own: its
    client hanging up cancels it (AGUI-7), recorded ``cancelled``."""
    started = trio.Event()

    @cantrip.gate()
    async def forever() -> str:
        """Never returns by itself."""
        started.set()
        await trio.sleep_forever()
        return "never"

    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [{"tool_calls": [{"gate": "call_agent", "args": {"intent": "wait", "llm": "kid"}}]}]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, call_agent, launch, forever], [cantrip.max_turns(5), cantrip.max_depth(1)]
        ),
        loom=cantrip.Loom(),
    ).with_(
        llms={
            "kid": cantrip.ScriptedLLM(
                [
                    {"tool_calls": [{"gate": "launch", "args": {"target": "moon"}}]},
                    {"tool_calls": [{"gate": "forever", "args": {}}]},
                ]
            )
        }
    )
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=20) as http:
        paused, interrupt = await paused_run(base, "t-child-gone")
        sid = paused[1]["snapshot"]["cantrip"]["session_id"]
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                body = run_input("t-child-gone", None, resume=resume)
                async with http.stream("POST", "/agui", json=body) as stream:
                    async for _ in stream.aiter_bytes():
                        pass

            nursery.start_soon(run)
            with trio.fail_after(10):
                await started.wait()
            nursery.cancel_scope.cancel()  # the client hangs up mid-run
        with trio.fail_after(10):
            while (await http.get(f"/sessions/{sid}")).json()["running"]:
                await trio.sleep(0.02)
        thread = (await http.get(f"/sessions/{sid}/thread")).json()
    assert thread["turns"][-1]["reason"] == "cancelled"


async def test_the_run_sent_again_ends_at_the_same_childs_interrupt_which_resumes() -> None:
    """A client that lost the interrupt run sends it again (the same ``runId``): it is
    told again the same way (AGUI-17), ending at the same interrupt, and that
    interrupt still resumes the waiting prompt -- once."""
    LAUNCHED.clear()
    async with serving(delegating(KID_LAUNCHES)) as base:
        body = run_input("t-child-again", "go")
        with trio.fail_after(15):
            _, first = await agui(base, body)
            _, again = await agui(base, body)
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        assert again[-1]["outcome"] == first[-1]["outcome"]
        told = [{k: v for k, v in e.items() if k != "timestamp"} for e in first[2:-3]]
        assert [{k: v for k, v in e.items() if k != "timestamp"} for e in again[2:-3]] == told
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-child-again", None, resume=resume))
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"] == "ok"
    assert LAUNCHED == ["moon"]


async def test_one_resume_may_answer_both_children_of_a_batch() -> None:
    """A client that knows both pauses (the first run's interrupt, the other from
    ``/pending``) answers them in one run: it tells the prompt from the first pause to
    the second, then on to the prompt's end."""
    LAUNCHED.clear()
    async with serving(batch_of_two()) as base:
        paused, interrupt = await paused_run(base, "t-batch-both")
        sid = paused[1]["snapshot"]["cantrip"]["session_id"]
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            with trio.fail_after(10):  # the other child asks too
                while (
                    len(pending := (await http.get(f"/sessions/{sid}/pending")).json()["pending"])
                    < 2
                ):
                    await trio.sleep(0.02)
        (other,) = [p["pause_id"] for p in pending if p["pause_id"] != interrupt["id"]]
        resume = [
            {"interruptId": pause_id, "status": "resolved", "payload": True}
            for pause_id in (interrupt["id"], other)
        ]
        with trio.fail_after(15):
            _, resumed = await agui(base, run_input("t-batch-both", None, resume=resume))
    assert resumed[-1]["type"] == "RUN_FINISHED", types(resumed)
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"] == "both"
    assert sorted(LAUNCHED) == ["mars", "moon"]
