"""ACP v1.7's stable features, driven by the official ``agent-client-protocol`` client
(1.0.0rc3, generated from ACP schema 1.23) against real ``cantrip acp`` processes:
``session/list``, ``session/resume`` after a restart, ``session/delete``,
``usage_update``, ``elicitation/create`` for ``ask_user``, ``$/cancel_request``, and a
steering message shown as the user message it is, where it was inserted."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from acp import RequestError, schema
from acp.stdio import spawn_agent_process
from acp_support import as_client, text_block

from cantrip import Loom

CANTRIP = str(Path(sys.executable).with_name("cantrip"))


def spec(path: Path, responses: str, *, extra: str = "", gates: str = '"done", "echo"') -> Path:
    path.write_text(
        f"""
[llm]
provider = "scripted"
script = "shared"
responses = [
{responses}
]

[circle]
medium = "conversation"
gates = [{gates}]
wards = [{{ max_turns = 6 }}]

[loom]
path = "{path.parent / "sessions.db"}"
{extra}
"""
    )
    return path


def finish(answer: str, extra: str = "") -> str:
    return f'  {{ tool_calls = [{{ gate = "done", args = {{ answer = "{answer}" }} }}]{extra} }},'


ECHO = '  { tool_calls = [{ gate = "echo", args = { text = "working" } }] },'


class Editor:
    """An ACP client that records what it is sent and answers elicitations."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.updates: list[Any] = []
        self.elicited: list[dict[str, Any]] = []
        self.answer = answer
        self.seen = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        self.seen.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        self.elicited.append({"message": message, "mode": mode, **kwargs})
        return schema.AcceptElicitationResponse(action="accept", content=self.answer)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        async def loop() -> None:
            while not predicate():
                self.seen.clear()
                await self.seen.wait()

        await asyncio.wait_for(loop(), timeout)

    def kinds(self, kind: str) -> list[Any]:
        return [u for u in self.updates if u.session_update == kind]


def run(main: Any) -> Any:
    return trio.to_thread.run_sync(asyncio.run, main)


async def test_sessions_are_listed_resumed_after_a_restart_and_deleted(tmp_path: Path) -> None:
    first = spec(tmp_path / "first.toml", finish("noted"))
    second = spec(tmp_path / "second.toml", finish("welcome back"))

    async def before() -> tuple[str, Any]:
        async with spawn_agent_process(as_client(Editor()), CANTRIP, "acp", str(first)) as (
            conn,
            _,
        ):
            init = await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            await conn.prompt(session_id=sid, prompt=[text_block("Remember the colour blue.")])
            return sid, init

    async def after(sid: str) -> dict[str, Any]:
        editor = Editor()
        out: dict[str, Any] = {}
        async with spawn_agent_process(
            as_client(editor), CANTRIP, "acp", str(second), cwd=str(tmp_path)
        ) as (conn, _):
            await conn.initialize(protocol_version=1)
            out["listed"] = await conn.list_sessions()
            out["elsewhere"] = await conn.list_sessions(cwd="/nowhere/else")
            out["resumed"] = await conn.resume_session(session_id=sid, cwd=str(tmp_path))
            out["replayed"] = list(editor.updates)
            out["again"] = await conn.prompt(session_id=sid, prompt=[text_block("Back?")])
            await conn.delete_session(session_id=sid)
            out["listed_after"] = await conn.list_sessions()
            try:
                await conn.resume_session(session_id=sid, cwd=str(tmp_path))
            except RequestError as exc:
                out["gone"] = exc
        return out

    sid, init = await run(before())
    caps = init.agent_capabilities.session_capabilities
    assert caps.resume is not None and caps.list is not None and caps.delete is not None
    out = await run(after(sid))
    (listed,) = out["listed"].sessions
    assert listed.session_id == sid and listed.title == "Remember the colour blue."
    assert listed.updated_at and out["elsewhere"].sessions == []
    assert out["replayed"] == []  # resume reattaches without replaying the history
    assert out["again"].stop_reason == "end_turn"
    assert out["again"].field_meta["cantrip"]["result"] == "welcome back"
    assert out["listed_after"].sessions == []
    assert out["gone"].code == -32002
    loom = Loom.open(tmp_path / "sessions.db")
    try:
        assert loom.entities == {}  # the whole tree went
    finally:
        loom.close()


async def test_listed_sessions_report_the_cwd_they_were_created_in(tmp_path: Path) -> None:
    """Each session keeps the ``cwd`` its ``session/new`` gave (its casts record it in
    the loom): after a restart in another directory, ``session/list`` reports each
    session's own, filters by it, and resume and load report it back."""
    path = spec(tmp_path / "spec.toml", f"{finish('one')}\n{finish('two')}")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "agent").mkdir()
    here, there = str(tmp_path / "a"), str(tmp_path / "b")

    async def before() -> tuple[str, str]:
        async with spawn_agent_process(as_client(Editor()), CANTRIP, "acp", str(path)) as (
            conn,
            _,
        ):
            await conn.initialize(protocol_version=1)
            first = (await conn.new_session(cwd=here)).session_id
            second = (await conn.new_session(cwd=there)).session_id
            for sid in (first, second):
                await conn.prompt(session_id=sid, prompt=[text_block("Hello.")])
            return first, second

    async def after() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with spawn_agent_process(
            as_client(Editor()), CANTRIP, "acp", str(path), cwd=str(tmp_path / "agent")
        ) as (conn, _):
            await conn.initialize(protocol_version=1)
            out["all"] = await conn.list_sessions()
            out["here"] = await conn.list_sessions(cwd=here)
            out["agent"] = await conn.list_sessions(cwd=str(tmp_path / "agent"))
            out["resumed"] = await conn.resume_session(session_id=first, cwd=there)
            out["loaded"] = await conn.load_session(session_id=second, cwd=here)
        return out

    first, second = await run(before())
    out = await run(after())
    assert {s.session_id: s.cwd for s in out["all"].sessions} == {first: here, second: there}
    assert [s.session_id for s in out["here"].sessions] == [first]
    assert out["agent"].sessions == []
    assert out["resumed"].field_meta["cantrip"]["cwd"] == here  # fixed when it was created
    assert out["loaded"].field_meta["cantrip"]["cwd"] == there


async def test_a_session_new_with_a_relative_cwd_is_refused(tmp_path: Path) -> None:
    path = spec(tmp_path / "spec.toml", finish("one"))

    async def main() -> Any:
        async with spawn_agent_process(as_client(Editor()), CANTRIP, "acp", str(path)) as (
            conn,
            _,
        ):
            await conn.initialize(protocol_version=1)
            try:
                await conn.new_session(cwd="not/absolute")
            except RequestError as exc:
                return exc, await conn.list_sessions()
        return None

    refused, listed = await run(main())
    assert refused.code == -32602 and "absolute" in str(refused)
    assert listed.sessions == []


async def test_each_model_call_reports_its_context_use(tmp_path: Path) -> None:
    usage = ", usage = { prompt_tokens = 300, completion_tokens = 20 }"
    path = spec(
        tmp_path / "spec.toml",
        f"{ECHO[:-3]}{usage} }},\n{finish('ok', usage)}",
        extra="[folding]\ncontext_window = 8000\n",
    )

    async def main() -> Editor:
        editor = Editor()
        async with spawn_agent_process(as_client(editor), CANTRIP, "acp", str(path)) as (conn, _):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            await conn.prompt(session_id=sid, prompt=[text_block("go")])
        return editor

    editor = await run(main())
    reported = editor.kinds("usage_update")
    assert [(u.used, u.size) for u in reported] == [(320, 8000), (320, 8000)]


async def test_ask_user_is_asked_as_an_elicitation_form(tmp_path: Path) -> None:
    ask = '  { tool_calls = [{ gate = "ask_user", args = { question = "Which colour?" } }] },'
    path = spec(tmp_path / "spec.toml", f"{ask}\n{finish('painted')}", gates='"done", "ask_user"')

    async def main() -> tuple[Editor, Any]:
        editor = Editor({"answer": "green"})
        # The library still routes elicitation/create only when asked to (its method
        # table predates elicitation's stabilization in ACP v1.7).
        async with spawn_agent_process(
            as_client(editor), CANTRIP, "acp", str(path), use_unstable_protocol=True
        ) as (conn, _):
            caps = schema.ClientCapabilities(
                elicitation=schema.ElicitationCapabilities(
                    form=schema.ElicitationFormCapabilities()
                )
            )
            await conn.initialize(protocol_version=1, client_capabilities=caps)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            answer = await conn.prompt(session_id=sid, prompt=[text_block("paint it")])
        return editor, answer

    editor, answer = await run(main())
    assert answer.stop_reason == "end_turn"
    (asked,) = editor.elicited
    assert asked["message"] == "Which colour?"
    assert asked["mode"].requested_schema.required == ["answer"]
    loom = Loom.open(tmp_path / "sessions.db")
    try:
        record = next(r for t in loom.turns for r in t.gate_calls if r.gate == "ask_user")
        assert record.result == "green"
    finally:
        loom.close()


async def test_a_prompt_withdrawn_by_cancel_request_is_cancelled(tmp_path: Path) -> None:
    path = spec(
        tmp_path / "spec.toml",
        f"{ECHO}\n{finish('too late', ', delay_ms = 60000')}\n{finish('still here')}",
    )

    async def main() -> Any:
        editor = Editor()
        async with spawn_agent_process(as_client(editor), CANTRIP, "acp", str(path)) as (conn, _):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            slow = asyncio.ensure_future(
                conn.prompt(session_id=sid, prompt=[text_block("take your time")])
            )
            await editor.wait_for(
                lambda: any(u.status == "completed" for u in editor.kinds("tool_call_update"))
            )
            slow.cancel()  # the client library sends $/cancel_request for it
            await asyncio.gather(slow, return_exceptions=True)
            return await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block("still there?")]), 30
            )

    after = await run(main())
    assert after.field_meta["cantrip"]["result"] == "still here"
    loom = Loom.open(tmp_path / "sessions.db")
    try:
        assert [t.reason for t in loom.turns if t.truncated] == ["cancelled"]
    finally:
        loom.close()


async def test_a_steering_message_is_shown_where_it_was_inserted(tmp_path: Path) -> None:
    # The second model call takes 3 s: the message, sent once the first call's echo
    # has run, joins the second turn or (sent just after it began) the third.
    path = spec(
        tmp_path / "spec.toml",
        f"{ECHO}\n{ECHO[:-3]}, delay_ms = 3000 }},\n{finish('steered')}",
    )

    async def main() -> tuple[Editor, Any, Any, list[Any]]:
        editor = Editor()
        async with spawn_agent_process(as_client(editor), CANTRIP, "acp", str(path)) as (conn, _):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            running = asyncio.ensure_future(
                conn.prompt(session_id=sid, prompt=[text_block("start")])
            )
            await editor.wait_for(
                lambda: any(u.status == "completed" for u in editor.kinds("tool_call_update"))
            )
            steered = await conn.prompt(
                session_id=sid,
                prompt=[text_block("use red instead")],
                cantrip={"onBusy": "steer"},  # the library sends keywords as _meta
            )
            done = await running
            loader = Editor()
        async with spawn_agent_process(as_client(loader), CANTRIP, "acp", str(path)) as (conn, _):
            await conn.initialize(protocol_version=1)
            await conn.load_session(session_id=sid, cwd=str(tmp_path))
        return editor, steered, done, loader.updates

    editor, steered, done, replayed = await run(main())
    assert steered.field_meta["cantrip"]["steered"] is True
    assert done.field_meta["cantrip"]["result"] == "steered"
    (live,) = [u for u in editor.kinds("user_message_chunk")]
    assert live.content.text == "use red instead" and live.message_id
    users = [u for u in replayed if u.session_update == "user_message_chunk"]
    assert [u.content.text for u in users] == ["start", "use red instead"]
    assert users[1].message_id == live.message_id  # the same message, live and replayed
    said = [u.session_update for u in replayed]
    # replayed where it joined: after the echo call's turn, before the reply it led to
    assert said.index("tool_call") < said.index("user_message_chunk", 1)


async def test_a_closed_session_stops_its_work_and_can_be_resumed(tmp_path: Path) -> None:
    path = spec(
        tmp_path / "spec.toml",
        f"{ECHO}\n{finish('too late', ', delay_ms = 60000')}\n{finish('back again')}",
    )

    async def main() -> tuple[Any, Any, Any]:
        editor = Editor()
        async with spawn_agent_process(as_client(editor), CANTRIP, "acp", str(path)) as (conn, _):
            init = await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            slow = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("slow")]))
            await editor.wait_for(
                lambda: any(u.status == "completed" for u in editor.kinds("tool_call_update"))
            )
            await conn.close_session(session_id=sid)
            ended = await asyncio.wait_for(slow, 30)
            await conn.resume_session(session_id=sid, cwd=str(tmp_path))
            again = await conn.prompt(session_id=sid, prompt=[text_block("again")])
        return init, ended, again

    init, ended, again = await run(main())
    assert init.agent_capabilities.session_capabilities.close is not None
    assert ended.stop_reason == "cancelled"
    assert again.field_meta["cantrip"]["result"] == "back again"
