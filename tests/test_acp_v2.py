"""The ACP v2 draft behind ``cantrip acp --protocol v2-draft``, driven by the official
client's v2 draft side (``acp.experimental.v2``, schema 2.0.0-alpha.5): a prompt is
acknowledged with its message id before its work ends, the session reports ``running``
and ``idle`` with a stop reason, a message sent while it works is inserted into the
running cast (acknowledged once a turn takes it), and two clients on one session see
each other's prompts, the second replaying the first's messages from the loom. An
approval is asked in the draft's ``request_permission`` shape (a title and a subject)
and the loom records each decision."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio
from acp.experimental import v2
from acp.stdio import spawn_stdio_transport
from acp_support import as_client

import cantrip
from cantrip.protocols.acp._stdio import serve_stdio
from cantrip.protocols.sessions._process import ProcessBackend
from cantrip.spec import build_cantrip, parse_spec

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
INFO = v2.schema.Implementation(name="test", version="1")


def text(value: str) -> v2.schema.TextContentBlock:
    return v2.schema.TextContentBlock(type="text", text=value)


class Watcher:
    """A v2 client that records the session updates it is told."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.seen = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        self.seen.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        async def loop() -> None:
            while not predicate():
                self.seen.clear()
                await self.seen.wait()

        await asyncio.wait_for(loop(), timeout)

    def states(self) -> list[tuple[str, str | None]]:
        return [
            (u.state, getattr(u, "stop_reason", None))
            for u in self.updates
            if u.session_update == "state_update"
        ]

    def users(self) -> list[tuple[str, str]]:
        out = []
        for u in self.updates:
            if u.session_update == "user_message":
                out.append((u.message_id, "".join(c.text for c in u.content)))
            elif u.session_update == "user_message_chunk":
                out.append((u.message_id, u.content.text))
        return out

    def answered_before_idle(self) -> bool:
        """Whether the last reply's text was told before the session last went idle
        (the client library hands notifications to the watcher in arrival order)."""
        said = [i for i, u in enumerate(self.updates) if u.session_update == "agent_message_chunk"]
        idle = [i for i, u in enumerate(self.updates) if getattr(u, "state", None) == "idle"]
        return bool(said and idle) and said[-1] < idle[-1]

    def said(self) -> str:
        return "".join(
            u.content.text for u in self.updates if u.session_update == "agent_message_chunk"
        )


SPEC = """
[llm]
provider = "scripted"
script = "shared"
responses = [
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "one" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "first done" }} }}] }},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 6 }}]

[loom]
path = "{loom}"
"""


class Steered(ProcessBackend):
    """The real backend, telling the test when a steering message has been queued."""

    queued: trio.Event

    async def steer(self, session_id: str, text: str) -> None:
        await super().steer(session_id, text)
        self.queued.set()


def held(until: trio.Event) -> cantrip.Gate:
    """A gate whose call ends only once ``until`` is set (what the test controls)."""

    @cantrip.gate(name="hold")
    async def hold(text: str) -> str:
        """Hold the turn until the test lets it end."""
        await until.wait()
        return text

    return hold


async def test_a_prompt_is_acknowledged_and_a_message_sent_meanwhile_is_inserted(
    tmp_path: Path,
) -> None:
    # The first turn's call holds until the backend has queued the steering message,
    # so the next turn takes it whatever the timing: no window to arrive in.
    built = build_cantrip(
        parse_spec(
            {
                "llm": {
                    "provider": "scripted",
                    "script": "shared",
                    "responses": [
                        {"tool_calls": [{"gate": "hold", "args": {"text": "one"}}]},
                        {"tool_calls": [{"gate": "done", "args": {"answer": "first done"}}]},
                    ],
                },
                "circle": {
                    "medium": "conversation",
                    "gates": ["done"],
                    "wards": [{"max_turns": 6}],
                },
                "loom": {"path": str(tmp_path / "loom.db")},
            }
        )
    )
    queued = trio.Event()
    circle = attrs.evolve(built.circle, gates=(*built.circle.gates, held(queued)))
    backend = Steered.serving(built.with_(circle=circle))
    backend.queued = queued
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def connection(stream: trio.SocketStream) -> None:
        await serve_stdio(
            backend.hub.spell, stdin=stream, stdout=stream, protocol="v2-draft", backend=backend
        )

    async def main() -> dict[str, Any]:
        watcher = Watcher()
        out: dict[str, Any] = {}
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = v2.ClientSideConnection(as_client(watcher), writer, reader)
        init = await conn.initialize(protocol_version=2, info=INFO)
        out["version"] = init.protocol_version
        sid = (await conn.new_session(cwd=str(tmp_path))).session_id
        first = await conn.prompt(session_id=sid, prompt=[text("start")])
        out["first"] = first.message_id
        out["idle_at_ack"] = ("idle", "end_turn") in watcher.states()
        await watcher.wait_for(
            lambda: any(u.session_update == "tool_call_update" for u in watcher.updates)
        )
        second = await conn.prompt(session_id=sid, prompt=[text("and this")])
        out["second"] = second.message_id
        await watcher.wait_for(
            lambda: ("idle", "end_turn") in watcher.states() and watcher.said() == "first done"
        )
        await conn.close()
        out["watcher"] = watcher
        return out

    async with backend.running(), trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, connection, listeners)
        out = await trio.to_thread.run_sync(asyncio.run, main())
        nursery.cancel_scope.cancel()
    watcher = out["watcher"]
    assert out["version"] == 2
    assert out["idle_at_ack"] is False  # acknowledged while the work went on
    assert watcher.states()[0] == ("running", None)
    assert watcher.states()[-1] == ("idle", "end_turn")
    assert out["second"].endswith(":steer:0")  # inserted into the running cast
    assert watcher.users() == [(out["first"], "start"), (out["second"], "and this")]
    assert watcher.said() == "first done"
    assert watcher.answered_before_idle()  # idle means nothing more is coming


def spell(loom: Path) -> cantrip.Cantrip:
    return build_cantrip(
        parse_spec(
            {
                "llm": {
                    "provider": "scripted",
                    "script": "shared",
                    "responses": [
                        {"tool_calls": [{"gate": "done", "args": {"answer": "hi one"}}]},
                        {"tool_calls": [{"gate": "done", "args": {"answer": "hi two"}}]},
                    ],
                },
                "circle": {
                    "medium": "conversation",
                    "gates": ["done"],
                    "wards": [{"max_turns": 3}],
                },
                "loom": {"path": str(loom)},
            }
        )
    )


async def test_two_clients_follow_one_session_and_replay_from_the_loom(tmp_path: Path) -> None:
    shared = ProcessBackend.serving(spell(tmp_path / "loom.db"))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def connection(stream: trio.SocketStream) -> None:
        await serve_stdio(
            shared.hub.spell, stdin=stream, stdout=stream, protocol="v2-draft", backend=shared
        )

    async def clients() -> dict[str, Any]:
        one, two = Watcher(), Watcher()
        r1, w1 = await asyncio.open_connection("127.0.0.1", port)
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        c1 = v2.ClientSideConnection(as_client(one), w1, r1)
        c2 = v2.ClientSideConnection(as_client(two), w2, r2)
        await c1.initialize(protocol_version=2, info=INFO)
        await c2.initialize(protocol_version=2, info=INFO)
        sid = (await c1.new_session(cwd=str(tmp_path))).session_id
        first = (await c1.prompt(session_id=sid, prompt=[text("hello")])).message_id
        await one.wait_for(lambda: ("idle", "end_turn") in one.states())
        await c2.resume_session(
            session_id=sid, cwd=str(tmp_path), replay_from=v2.schema.ReplayFromStartVariant()
        )
        replayed = list(two.users())
        second = (await c2.prompt(session_id=sid, prompt=[text("me too")])).message_id
        await one.wait_for(lambda: one.states().count(("idle", "end_turn")) == 2)
        await two.wait_for(lambda: ("idle", "end_turn") in two.states())
        await c1.close()
        await c2.close()
        return {"one": one, "two": two, "first": first, "second": second, "replayed": replayed}

    async with shared.running(), trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, connection, listeners)
        out = await trio.to_thread.run_sync(asyncio.run, clients())
        nursery.cancel_scope.cancel()
    one, two = out["one"], out["two"]
    assert out["replayed"] == [(out["first"], "hello")]  # from the loom, with its id
    assert one.users() == [(out["first"], "hello"), (out["second"], "me too")]
    assert one.said().split() == ["hi", "one", "hi", "two"]  # and the second's prompt
    assert two.said().startswith("hi one") and two.said().endswith("hi two")  # replayed, live
    replies = {u.message_id for u in one.updates if u.session_update == "agent_message_chunk"}
    assert len(replies) == 2  # a message id per reply


async def test_a_cancel_ends_the_work_and_the_session_goes_idle_cancelled(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        SPEC.format(loom=tmp_path / "loom.db").replace(
            '{ text = "one" } }] }', '{ text = "one" } }], delay_ms = 60000 }'
        )
    )
    assert "delay_ms = 60000" in spec.read_text()

    async def main() -> Watcher:
        watcher = Watcher()
        async with spawn_stdio_transport(CANTRIP, "acp", str(spec), "--protocol", "v2-draft") as (
            reader,
            writer,
            _process,
        ):
            conn = v2.ClientSideConnection(as_client(watcher), writer, reader)
            await conn.initialize(protocol_version=2, info=INFO)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            await conn.prompt(session_id=sid, prompt=[text("slowly")])
            await watcher.wait_for(lambda: ("running", None) in watcher.states())
            await conn.cancel_session(session_id=sid)
            await watcher.wait_for(lambda: ("idle", "cancelled") in watcher.states())
        return watcher

    watcher = await trio.to_thread.run_sync(asyncio.run, main())
    assert watcher.states() == [("running", None), ("idle", "cancelled")]


APPROVALS = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "ls" }} }}] }},
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "rm -rf build" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "finished" }} }}] }},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 6 }}]
approve = ["echo"]

[loom]
path = "{loom}"
"""


class Approver(Watcher):
    """A v2 client that answers permission requests, in order, with the options given."""

    def __init__(self, *options: str) -> None:
        super().__init__()
        self.options = list(options)
        self.asked: list[v2.schema.RequestPermissionRequest] = []

    async def request_permission(
        self,
        session_id: str,
        title: str,
        options: list[v2.schema.PermissionOption],
        description: str | None = None,
        subject: Any = None,
        **kwargs: Any,
    ) -> v2.schema.RequestPermissionResponse:
        self.asked.append(
            v2.schema.RequestPermissionRequest(
                session_id=session_id,
                title=title,
                options=options,
                description=description,
                subject=subject,
            )
        )
        return v2.schema.RequestPermissionResponse(
            outcome=v2.schema.SelectedPermissionOutcomeVariant(option_id=self.options.pop(0))
        )


async def test_approvals_are_asked_in_the_v2_shape_and_each_decision_is_recorded(
    tmp_path: Path,
) -> None:
    loom_path = tmp_path / "loom.db"
    spec = tmp_path / "spec.toml"
    spec.write_text(APPROVALS.format(loom=loom_path))

    async def main() -> Approver:
        approver = Approver("allow_once", "reject_once")
        async with spawn_stdio_transport(CANTRIP, "acp", str(spec), "--protocol", "v2-draft") as (
            reader,
            writer,
            _process,
        ):
            conn = v2.ClientSideConnection(as_client(approver), writer, reader)
            await conn.initialize(protocol_version=2, info=INFO)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            await conn.prompt(session_id=sid, prompt=[text("clean up")])
            await approver.wait_for(lambda: ("idle", "end_turn") in approver.states())
        return approver

    approver = await trio.to_thread.run_sync(asyncio.run, main())
    assert [a.title for a in approver.asked] == [
        'echo({"text": "ls"})',
        'echo({"text": "rm -rf build"})',
    ]
    subjects = [a.subject for a in approver.asked]
    assert all(isinstance(s, v2.schema.ToolCallPermissionSubjectVariant) for s in subjects)
    assert [s.tool_call.raw_input for s in subjects] == [{"text": "ls"}, {"text": "rm -rf build"}]
    assert [[o.option_id for o in a.options] for a in approver.asked] == [
        ["allow_once", "allow_always", "reject_once", "reject_always"]
    ] * 2
    assert ("requires_action", None) in approver.states()
    assert approver.said() == "finished"
    loom = cantrip.Loom.open(loom_path)
    try:
        echoes = [r for t in loom.turns for r in t.gate_calls if r.gate == "echo"]
    finally:
        loom.close()
    allowed, rejected = echoes
    assert allowed.result == "ls" and allowed.detail["approval"]["decision"] == "approve"
    assert rejected.is_error and rejected.result == "denied by the user: rejected in the editor"
    assert rejected.detail["approval"]["decision"] == "deny"


QUESTION = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "ask_user", args = {{ question = "Which colour?" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "painted" }} }}] }},
]

[circle]
medium = "conversation"
gates = ["done", "ask_user"]
wards = [{{ max_turns = 6 }}]

[loom]
path = "{loom}"
"""


class Answerer(Watcher):
    """A v2 client that answers form elicitations with ``content``."""

    def __init__(self, content: dict[str, Any]) -> None:
        super().__init__()
        self.content = content
        self.asked: list[dict[str, Any]] = []

    async def create_elicitation(self, message: str, mode: str, **kwargs: Any) -> Any:
        self.asked.append({"message": message, "mode": mode, **kwargs})
        return v2.schema.AcceptElicitationResponse(content=self.content)


async def test_an_ask_user_question_is_asked_as_a_v2_form_elicitation(tmp_path: Path) -> None:
    """On a v2 connection an ``ask_user`` question is the draft's ``elicitation/create``
    in form mode, scoped to the session and its tool call, with a schema the v2 client
    validates; the answer reaches the gate and the loom records it."""
    loom_path = tmp_path / "loom.db"
    spec = tmp_path / "spec.toml"
    spec.write_text(QUESTION.format(loom=loom_path))

    async def main() -> Answerer:
        answerer = Answerer({"answer": "green"})
        async with spawn_stdio_transport(CANTRIP, "acp", str(spec), "--protocol", "v2-draft") as (
            reader,
            writer,
            _process,
        ):
            conn = v2.ClientSideConnection(as_client(answerer), writer, reader)
            caps = v2.schema.ClientCapabilities(
                elicitation=v2.schema.ElicitationCapabilities(
                    form=v2.schema.ElicitationFormCapabilities()
                )
            )
            await conn.initialize(protocol_version=2, info=INFO, capabilities=caps)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            await conn.prompt(session_id=sid, prompt=[text("paint it")])
            await answerer.wait_for(lambda: ("idle", "end_turn") in answerer.states())
        return answerer

    answerer = await trio.to_thread.run_sync(asyncio.run, main())
    (asked,) = answerer.asked
    assert (asked["message"], asked["mode"]) == ("Which colour?", "form")
    assert asked["session_id"] and asked["tool_call_id"]
    requested = asked["requested_schema"]
    assert isinstance(requested, v2.schema.ElicitationSchema)
    assert requested.required == ["answer"]
    assert ("requires_action", None) in answerer.states()
    assert answerer.said() == "painted"
    loom = cantrip.Loom.open(loom_path)
    try:
        (record,) = [r for t in loom.turns for r in t.gate_calls if r.gate == "ask_user"]
    finally:
        loom.close()
    assert record.result == "green"
