"""The model behind the session backend contract (tests/test_session_backend_contract.py).

One rule for what the model does next, :func:`decide`, from the conversation alone
(like a real model's): the loopback OpenAI server :class:`SeamOpenAI` answers with it
(the in-process backend's entities and the PostgreSQL backend's worker call it over
HTTP), and the test double (tests/session_double.py) runs it directly. Within a
prompt ``P`` it calls ``echo`` until the prompt's third turn, then ``done`` with
``"P ok #<user messages seen>"`` -- so a result says which messages the model saw (a
follow-up answers ``#2``, a rolled-back one ``#1``, a steering message that joined
becomes the latest user message and is answered for).

* ``hold:NAME`` in the prompt: its last call is held (:class:`Holds`) -- a test knows
  the cast is in its last turn and keeps it there while it acts, with no sleep;
* ``until-told``: ``echo`` until another user message (a steering message) arrives;
* ``ask:``: the first call is ``ask_user("Which colour?")``; the final answer names
  what the human said (``... in <answer>``);
* ``tool:NAME``: the first call is the client's tool ``NAME`` -- if the model is
  offered it (a prompt submitted with ``tools``); the final answer names its result.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Collection
from typing import Any

import trio
from fake_providers import Answer, Call, FakeOpenAI, Request, Sender

KEY = "seam-test-key"
TURNS = 3
HOLD = re.compile(r"hold:(\w+)")
TOOL = re.compile(r"tool:(\w+)")


class Holds:
    """Model calls held until a test lets them go (all in this trio run)."""

    def __init__(self) -> None:
        self._held: dict[str, trio.Event] = {}
        self._released: dict[str, trio.Event] = {}

    def _events(self, name: str) -> tuple[trio.Event, trio.Event]:
        held = self._held.setdefault(name, trio.Event())
        released = self._released.setdefault(name, trio.Event())
        return held, released

    async def at(self, name: str) -> None:
        """A call that says ``hold:name``: held until released."""
        held, released = self._events(name)
        held.set()
        await released.wait()

    @contextlib.asynccontextmanager
    async def holding(self, name: str) -> AsyncIterator[None]:
        """Wait until the cast whose prompt says ``hold:name`` is in its last call;
        that call is answered when the block is left."""
        held, released = self._events(name)
        try:
            with trio.fail_after(60):
                await held.wait()
            yield
        finally:
            released.set()


def decide(
    prompt: str, steps: int, users: int, told: list[str], tools: Collection[str] = ()
) -> tuple[str, dict[str, Any]]:
    """The next call: ``(gate, arguments)``. ``steps``: the model's answers since the
    latest user message ``prompt``; ``users``: user messages seen; ``told``: the
    results of its calls since; ``tools``: the names of the tools it is offered."""
    if "ask:" in prompt and steps == 0:
        return "ask_user", {"question": "Which colour?"}
    tool = TOOL.search(prompt)
    if tool is not None and steps == 0 and tool.group(1) in tools:
        return tool.group(1), {"precision": "city"}
    if "until-told" in prompt or steps + 1 < TURNS:
        return "echo", {"text": f"step {steps + 1}"}
    answer = f"{prompt} ok #{users}"
    called = tool is not None and tool.group(1) in tools
    if ("ask:" in prompt or called) and told:
        answer += f" in {told[0]}"
    return "done", {"answer": answer}


def is_last(prompt: str, steps: int) -> bool:
    """Whether the call ``decide`` answers now ends the cast (where a hold holds)."""
    return "until-told" not in prompt and steps + 1 >= TURNS


class SeamOpenAI(FakeOpenAI):
    """The OpenAI wire format (tests/fake_providers.py), answering with :func:`decide`."""

    def __init__(self, holds: Holds) -> None:
        super().__init__([], key=KEY)
        self.holds = holds

    async def respond(self, request: Request, send: Sender) -> None:
        body: Any = request.json()
        messages = list(body.get("messages") or [])
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if users:
            last = users[-1]
            prompt = str(messages[last].get("content"))
            after = messages[last:]
            steps = sum(1 for m in after if m.get("role") == "assistant")
            told = [str(m.get("content")) for m in after if m.get("role") == "tool"]
            hold = HOLD.search(prompt)
            if hold is not None and is_last(prompt, steps):
                await self.holds.at(hold.group(1))
            tools = [str((t.get("function") or {}).get("name")) for t in body.get("tools") or ()]
            gate, arguments = decide(prompt, steps, len(users), told, tools)
            # no checkpoint from here to the parent's pop: concurrent answers never mix
            self.script = [Answer(calls=(Call(gate, arguments),))]
        await super().respond(request, send)


def spec(base_url: str) -> dict[str, Any]:
    """The spec every backend builds its cantrip from (a worker from the queued spell)."""
    return {
        "llm": {
            "provider": "openai",
            "model": "gpt-5-mini",
            "base_url": base_url,
            "api_key_env": "SEAM_TEST_KEY",
        },
        "identity": {"system_prompt": "Echo, then finish."},
        "circle": {
            "medium": "conversation",
            "gates": ["done", "echo", "ask_user"],
            "wards": [{"max_turns": 200}],
        },
    }
