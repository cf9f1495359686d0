"""A tiny, honest model for the cross-session eval example (``examples/evals/memory.yaml``):
it answers only from what its context shows, so memory that is off genuinely fails.

* Told a fact -- an intent ``Remember: my <subject> is <value>.`` -- it calls ``remember``
  (key: the subject, value: the sentence) when its circle offers that gate, then ``done``;
  without the gate it can only say it cannot keep it.
* Asked -- ``What is my <subject>?`` -- it looks for the subject's words in the memory its
  context holds (the lines ``- key: value`` automatic recall adds after the intent) and
  answers with the value it finds; else ``I don't know.``

It never sees the case's expectations or anything but the messages it is sent. The
shipped recording (``examples/evals/memory.recording.jsonl``) is this model's answers,
recorded with memory on and with memory off; ``python tests/memory_reader.py`` records it
again (tests/test_eval_memory.py replays it and re-records it).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from cantrip.llm._contract import Message, Response, ToolCall, ToolChoice, ToolDefinition

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "cantrip" / "examples"
SUITE = EXAMPLES / "evals" / "memory.yaml"
RECORDING = EXAMPLES / "evals" / "memory.recording.jsonl"
SPECS = {"on": EXAMPLES / "memory.toml", "off": EXAMPLES / "memory_off.toml"}

_TOLD = re.compile(r"^remember:\s*my\s+(?P<subject>.+?)\s+(?:is|are)\s+(?P<value>.+?)\.?$", re.I)
_ASKED = re.compile(r"^what\s+(?:is|are)\s+my\s+(?P<subject>.+?)\s*\?*$", re.I)
_LINE = re.compile(r"^- (?P<key>[^:]+): (?P<value>.*)$")


class MemoryReader:
    """The model (an :class:`~cantrip.llm.LLM`): stateless, reads only ``messages``."""

    name = "memory-reader"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        intent = next(m.content or "" for m in messages if m.role == "user")
        offered = {tool.name for tool in tools}
        done_already = any(m.role == "tool" for m in messages)
        told = _TOLD.match(intent.strip())
        if told and not done_already:
            if "remember" in offered:
                key = "-".join(told["subject"].lower().split())
                sentence = f"my {told['subject']} is {told['value']}"
                return _call("remember", key=key, value=sentence)
            return _call("done", answer="I cannot keep that beyond this session.")
        if told:
            return _call("done", answer="Noted.")
        asked = _ASKED.match(intent.strip())
        if asked:
            return _call("done", answer=_answer(asked["subject"], _context(messages, intent)))
        return _call("done", answer="I don't know.")


def _context(messages: Sequence[Message], intent: str) -> list[str]:
    """Every line of the context but the intent itself: what the model may know."""
    lines: list[str] = []
    for message in messages:
        if message.role in ("system", "user") and message.content and message.content != intent:
            lines.extend(message.content.splitlines())
    return lines


def _answer(subject: str, lines: list[str]) -> str:
    words = set(subject.lower().split())
    for line in lines:
        found = _LINE.match(line.strip())
        if found and words <= set(found["key"].lower().split("-")):
            value = found["value"]
            told = re.match(r"my\s+.+?\s+(?:is|are)\s+(.+)$", value, re.I)
            return f"Your {subject} is {told[1] if told else value}."
    return "I don't know."


_ids = iter(range(1, 1_000_000))


def _call(gate: str, **args: Any) -> Response:
    return Response(tool_calls=(ToolCall(f"reader-{next(_ids)}", gate, args),))


async def record(recording: Path = RECORDING) -> dict[str, float]:
    """Record the suite with this model, memory on and off, into ``recording`` (a new
    file); the pass rate of each."""
    from cantrip.evals import load_suite, run_suite
    from cantrip.spec import build_cantrip, load_spec_file

    recording.unlink(missing_ok=True)
    suite = load_suite(SUITE)
    rates: dict[str, float] = {}
    for mode, spec in SPECS.items():
        doc = load_spec_file(spec)

        def build(loom: Any, doc: Any = doc, spec: Path = spec) -> Any:
            return build_cantrip(
                doc, base_dir=spec.parent, loom=loom, llm=MemoryReader(), memory_given=True
            )

        report = await run_suite(suite, cantrip=build, record=recording, concurrency=1)
        rates[mode] = report.to_dict()["summary"]["pass_rate"]
    return rates


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else RECORDING
    print(trio.run(record, target))
