"""A loopback OpenAI server for the ``serve --db`` tests, run as a process of its own.

Workers on other processes share it, so its answers come from the request
alone, like a real model's: :class:`ConversationOpenAI` is the OpenAI fake of
``tests/fake_providers.py`` (the real wire format and request rules) whose next
answer is computed from the messages. Within a prompt it calls ``echo`` until
the prompt's ``TURNS``-th turn, then ``done`` with ``"<prompt> ok #<n>"``,
where ``n`` counts the user messages it was sent -- a follow-up prompt that
continues the conversation answers ``#2``.

With ``SERVE_DB_LLM_CHATTY=1`` in its environment each answer also says a line of
text and a line of reasoning (``Step <n>: <prompt>``); a prompt that says
``forever`` is answered ten times slower (a cast a test can hang up on midway).
Offered a tool named ``get_location`` (an AG-UI front end's), it calls that first and
names its result in the final answer; offered ``ask_user``, it asks "Which colour?"
first, and names the answer.

With ``SERVE_DB_LLM_HOLD_DIR=DIR``, a prompt that says ``hold:NAME`` has its final
answer held: the server makes ``DIR/NAME.held`` and answers once ``DIR/NAME.release``
exists. A test so knows the cast is in its last turn, and keeps it there while it
does what it names (a message arriving then, a second prompt while one runs) --
instead of hoping a delay is long enough on a loaded machine.

Run: ``python tests/serve_db_llm.py --turns 3 --delay 0.1``; prints ``url <base
url>`` on stdout and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

import trio
from fake_providers import Answer, Call, FakeOpenAI, Request, Sender, serve

KEY = "serve-db-test-key"


HOLD = re.compile(r"hold:(\w+)")


async def _held(folder: Path, name: str) -> None:
    """Says the answer is held (``NAME.held``), then waits for ``NAME.release``."""
    (folder / f"{name}.held").touch()
    while not (folder / f"{name}.release").exists():
        await trio.sleep(0.01)


class ConversationOpenAI(FakeOpenAI):
    def __init__(self, turns: int, delay_s: float) -> None:
        super().__init__([], key=KEY)
        self.turns = turns
        self.delay_s = delay_s
        self.chatty = os.environ.get("SERVE_DB_LLM_CHATTY") == "1"
        hold_dir = os.environ.get("SERVE_DB_LLM_HOLD_DIR")
        self.hold_dir = Path(hold_dir) if hold_dir else None

    async def respond(self, request: Request, send: Sender) -> None:
        # the delay comes first: from setting the script to the parent popping it there is
        # no checkpoint, so concurrent requests never answer with each other's script
        try:
            body: Any = request.json()
            messages = list(body.get("messages") or [])
        except (ValueError, AttributeError):
            messages = []
        slow = any("forever" in str(m.get("content")) for m in messages if m.get("role") == "user")
        await trio.sleep(self.delay_s * (10 if slow else 1))
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if users:
            last = users[-1]
            prompt = messages[last].get("content")
            steps = sum(1 for m in messages[last:] if m.get("role") == "assistant")
            hold = HOLD.search(str(prompt))
            if hold is not None and steps + 1 >= self.turns and self.hold_dir is not None:
                await _held(self.hold_dir, hold.group(1))
            offered = [(t.get("function") or {}).get("name") for t in body.get("tools") or []]
            client = "get_location" in offered  # a front end's own tool (AG-UI)
            asks = "ask_user" in offered
            if client and steps == 0:
                call = Call("get_location", {"precision": "city"})
            elif asks and steps == 0:
                call = Call("ask_user", {"question": "Which colour?"})
            elif steps + 1 >= self.turns:
                answer = f"{prompt} ok #{len(users)}"
                if client or asks:
                    told = [m.get("content") for m in messages[last:] if m.get("role") == "tool"]
                    answer += f" in {told[0]}"
                call = Call("done", {"answer": answer})
            else:
                call = Call("echo", {"text": f"step {steps + 1}"})
            said = f"Step {steps + 1}: {prompt}" if self.chatty else None
            self.script = [Answer(text=said, thinking=said, calls=(call,))]
        await super().respond(request, send)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    async with serve(ConversationOpenAI(args.turns, args.delay), "/v1") as url:
        print(f"url {url}", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin


if __name__ == "__main__":
    trio.run(main)
