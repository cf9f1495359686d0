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

Run: ``python tests/serve_db_llm.py --turns 3 --delay 0.1``; prints ``url <base
url>`` on stdout and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import trio
from fake_providers import Answer, Call, FakeOpenAI, Request, Sender, serve

KEY = "serve-db-test-key"


class ConversationOpenAI(FakeOpenAI):
    def __init__(self, turns: int, delay_s: float) -> None:
        super().__init__([], key=KEY)
        self.turns = turns
        self.delay_s = delay_s
        self.chatty = os.environ.get("SERVE_DB_LLM_CHATTY") == "1"

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
