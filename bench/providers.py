"""Overhead of the provider layer, and the import time of cantrip.

What it measures
----------------
1. **Adapter CPU per call** (no network): for OpenAI chat completions, the
   OpenAI Responses API, Anthropic and Gemini,
   the work an adapter does around one call -- render the transcript,
   build the request body, serialize it, then parse a canned response
   payload (``query``) or fold a canned SSE stream into a response
   (``stream``, events delivered to a no-op sink). Measured for a short
   context (system + user) and a long one (50 tool-calling turns), so the
   O(messages) part (rendering, serialization) is visible.

   **Stream parse cost per event**: the fold of each canned stream alone
   (SSE decoding, JSON parsing, the adapter's state machine, the final
   parse), divided by its number of events -- the Responses stream (typed
   events, a reasoning item with an encrypted payload) next to chat
   completions' chunks.

2. **Round trip over loopback** (``query`` and ``stream``): the whole adapter
   stack -- the above plus httpx on trio, one pooled keep-alive connection --
   against a zero-latency HTTP/1.1 server on 127.0.0.1 started by this script
   that answers every request with canned bytes (h11, no validation). The
   server's own cost is included; it is the floor of a real call.

3. **Import time**: ``python -X importtime -c "import cantrip"`` in fresh
   interpreters (median of ``--imports`` runs; the cumulative time of the
   ``cantrip`` package), with the number of provider modules and whether httpx
   were loaded (both must be zero/false); and the extra time of the first
   ``load_llm("openai")`` (httpx, the adapter module, the TOML).

Each timing is the median of ``--repeats`` batches of ``--calls`` calls,
reported in microseconds per call.

How to run
----------
From the repository root::

    python bench/providers.py
    python bench/providers.py --calls 500 --repeats 7 --imports 9
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import h11
import trio

os.environ.setdefault("OPENAI_API_KEY", "bench-key")
os.environ.setdefault("CANTRIP_PROVIDERS_DIR", "/nonexistent")
os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
os.environ.setdefault("GEMINI_API_KEY", "bench-key")

from cantrip.llm import Message, ToolCall, ToolDefinition, load_llm
from cantrip.llm._sse import iter_sse
from cantrip.llm.providers._base import HTTPAdapter, dumps
from cantrip.llm.providers._render_memo import RenderCache

PROVIDERS = {
    "openai": "/v1",
    "openai_responses": "/v1",
    "anthropic": "/v1",
    "gemini": "/v1beta",
}
MODELS = {
    "openai": "gpt-4o-mini",
    "openai_responses": "gpt-5-mini",
    "anthropic": "claude-sonnet-5-5",
    "gemini": "gemini-2.5-flash",
}
SUMMARY = "The user wants their text echoed; call echo, then finish."
ENCRYPTED = "gAAAAA" + "x" * 1500
"""About the size of a short reasoning item's encrypted_content."""
TOOLS = [
    ToolDefinition(
        "echo",
        "Return the text.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
    ToolDefinition(
        "done",
        "Finish.",
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    ),
]
TEXT = "Sure -- echoing your text now, then I will finish."


def context(turns: int) -> list[Message]:
    messages = [Message("system", "You are a benchmark."), Message("user", "Echo things.")]
    for i in range(turns):
        call = ToolCall(f"call_{i:04d}", "echo", {"text": f"message number {i}"})
        messages.append(Message("assistant", f"Turn {i}.", tool_calls=(call,)))
        messages.append(Message("tool", f"message number {i}", tool_call_id=call.id, name="echo"))
    return messages


# -- canned provider answers -------------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def canned(provider: str) -> tuple[bytes, bytes]:
    """(whole JSON answer, SSE answer) with some text and one tool call."""
    args = {"text": "hello"}
    words = [TEXT[i : i + 8] for i in range(0, len(TEXT), 8)]
    if provider == "openai":
        whole = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": TEXT,
                        "tool_calls": [
                            {
                                "id": "call_x",
                                "type": "function",
                                "function": {"name": "echo", "arguments": json.dumps(args)},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }

        def chunk(delta: Any, finish: str | None = None) -> str:
            return sse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "model": "gpt-4o-mini",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": w}) for w in words]
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_x",
                            "type": "function",
                            "function": {"name": "echo", "arguments": json.dumps(args)},
                        }
                    ]
                }
            )
        )
        events.append(chunk({}, "tool_calls"))
        events.append(sse({"choices": [], "usage": whole["usage"]}))
        events.append("data: [DONE]\n\n")
    elif provider == "openai_responses":
        reasoning = {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": SUMMARY}],
            "encrypted_content": ENCRYPTED,
        }
        message = {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
        }
        call = {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_x",
            "name": "echo",
            "arguments": json.dumps(args),
        }
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 8},
            "total_tokens": 120,
        }
        whole = {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": "gpt-5-mini",
            "output": [reasoning, message, call],
            "usage": usage,
        }
        seq = iter(range(1000))

        def typed(kind: str, **data: Any) -> str:
            return sse({"type": kind, "sequence_number": next(seq), **data}, kind)

        summary_words = [SUMMARY[i : i + 8] for i in range(0, len(SUMMARY), 8)]
        events = [typed("response.created", response={**whole, "output": [], "usage": None})]
        events.append(
            typed("response.output_item.added", output_index=0, item={**reasoning, "summary": []})
        )
        events += [
            typed("response.reasoning_summary_text.delta", output_index=0, delta=w)
            for w in summary_words
        ]
        events.append(typed("response.output_item.done", output_index=0, item=reasoning))
        events.append(
            typed("response.output_item.added", output_index=1, item={**message, "content": []})
        )
        events += [
            typed("response.output_text.delta", output_index=1, content_index=0, delta=w)
            for w in words
        ]
        events.append(typed("response.output_item.done", output_index=1, item=message))
        events.append(
            typed("response.output_item.added", output_index=2, item={**call, "arguments": ""})
        )
        events.append(
            typed("response.function_call_arguments.delta", output_index=2, delta=json.dumps(args))
        )
        events.append(typed("response.output_item.done", output_index=2, item=call))
        events.append(typed("response.completed", response=whole))
    elif provider == "anthropic":
        whole = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-20250514",
            "content": [
                {"type": "text", "text": TEXT},
                {"type": "tool_use", "id": "toolu_x", "name": "echo", "input": args},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 20},
        }
        start = {**whole, "content": [], "stop_reason": None}
        events = [sse({"type": "message_start", "message": start}, "message_start")]
        events.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
        )
        events += [
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": w},
                },
                "content_block_delta",
            )
            for w in words
        ]
        events.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        events.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {
                        "type": "tool_use",
                        "id": "toolu_x",
                        "name": "echo",
                        "input": {},
                    },
                },
                "content_block_start",
            )
        )
        events.append(
            sse(
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)},
                },
                "content_block_delta",
            )
        )
        events.append(sse({"type": "content_block_stop", "index": 1}, "content_block_stop"))
        events.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 20},
                },
                "message_delta",
            )
        )
        events.append(sse({"type": "message_stop"}, "message_stop"))
    else:
        usage = {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 120}
        whole = {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [{"text": TEXT}, {"functionCall": {"name": "echo", "args": args}}],
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": usage,
            "modelVersion": "gemini-2.5-flash",
            "responseId": "resp-1",
        }
        events = [
            sse(
                {
                    "candidates": [{"content": {"role": "model", "parts": [{"text": w}]}}],
                    "responseId": "resp-1",
                }
            )
            for w in words
        ]
        events.append(
            sse(
                {
                    "candidates": [
                        {
                            "content": {
                                "role": "model",
                                "parts": [{"functionCall": {"name": "echo", "args": args}}],
                            },
                            "finishReason": "STOP",
                        }
                    ],
                    "usageMetadata": usage,
                    "responseId": "resp-1",
                }
            )
        )
    return json.dumps(whole).encode(), "".join(events).encode()


# -- the zero-latency server -------------------------------------------------------------------


async def _serve_connection(answers: tuple[bytes, bytes], stream: trio.SocketStream) -> None:
    whole, events = answers
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            body = bytearray()
            target = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Request):
                    target = event.target
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            streaming = b'"stream":true' in body or b"streamGenerateContent" in target
            payload = events if streaming else whole
            kind = b"text/event-stream" if streaming else b"application/json"
            data = conn.send(
                h11.Response(
                    status_code=200,
                    headers=[
                        (b"content-type", kind),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                )
            )
            data = (data or b"") + (conn.send(h11.Data(data=payload)) or b"")
            data += conn.send(h11.EndOfMessage()) or b""
            await stream.send_all(data)
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        return
    finally:
        await stream.aclose()


# -- measurements ------------------------------------------------------------------------------


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    results = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        results.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(results)


def cpu_only(
    llm: HTTPAdapter, provider: str, messages: list[Message], calls: int, repeats: int, warm: bool
) -> tuple[float, float]:
    """Median us per call. ``warm``: the renderer has seen all but the last turn (a cast's
    next turn); otherwise every call renders the whole history afresh (a first call)."""
    whole, events = canned(provider)
    payload = json.loads(whole)
    lines = events.decode().split("\n")
    sink: Callable[[Any], None] = lambda event: None  # noqa: E731

    def one(streamed: bool) -> float:
        cache = RenderCache(
            llm.render_family, llm.keep_thinking, reasoning_format=llm.reasoning_format
        )
        if warm:
            cache.render(messages[:-2])
        started = time.perf_counter()
        rendered = cache.render(messages)
        _url, body = llm.build_request(
            rendered.messages, TOOLS, "auto", {"temperature": 0.2}, streamed
        )
        dumps(body)
        if streamed:
            state = llm.new_stream(rendered.messages, sink)
            for event in iter_sse(lines):
                if state.feed(event):
                    break
            llm._finish(state.finish(), rendered.id_map)
        else:
            llm._finish(llm.parse(payload, rendered.messages), rendered.id_map)
        return time.perf_counter() - started

    out = []
    for streamed in (False, True):
        batches = [sum(one(streamed) for _ in range(calls)) / calls * 1e6 for _ in range(repeats)]
        out.append(statistics.median(batches))
    return out[0], out[1]


async def round_trips(calls: int, repeats: int) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    messages = context(1)
    for provider, prefix in PROVIDERS.items():
        async with trio.open_nursery() as nursery:
            handler = functools.partial(_serve_connection, canned(provider))
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            llm = load_llm(provider, MODELS[provider], base_url=f"http://127.0.0.1:{port}{prefix}")
            sink: Callable[[Any], None] = lambda event: None  # noqa: E731
            for _ in range(20):  # warm up the connection and caches
                await llm.query(messages, TOOLS, "auto")
            timings: dict[str, list[float]] = {"query": [], "stream": []}
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(calls):
                    await llm.query(messages, TOOLS, "auto")
                timings["query"].append((time.perf_counter() - started) / calls * 1e6)
                started = time.perf_counter()
                for _ in range(calls):
                    await llm.stream(messages, TOOLS, "auto", on_event=sink)
                timings["stream"].append((time.perf_counter() - started) / calls * 1e6)
            await llm.aclose()
            nursery.cancel_scope.cancel()
        out[provider] = (statistics.median(timings["query"]), statistics.median(timings["stream"]))
    return out


def per_event(provider: str, calls: int, repeats: int) -> tuple[int, float, float]:
    """(events, us per event, us per whole stream): folding a canned stream, nothing else."""
    llm = load_llm(provider, MODELS[provider], base_url="http://127.0.0.1:9/v1")
    _whole, events = canned(provider)
    lines = events.decode().split("\n")
    count = sum(1 for _ in iter_sse(lines))
    messages = context(0)
    sink: Callable[[Any], None] = lambda event: None  # noqa: E731

    def fold() -> None:
        state = llm.new_stream(messages, sink)
        for event in iter_sse(lines):
            if state.feed(event):
                break
        state.finish()

    whole_us = per_call_us(fold, calls, repeats)
    return count, whole_us / count, whole_us


def import_times(runs: int) -> dict[str, Any]:
    cumulative: list[float] = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import cantrip"],
            capture_output=True,
            text=True,
            check=True,
        )
        for line in proc.stderr.splitlines():
            match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| cantrip$", line)
            if match:
                cumulative.append(int(match.group(1)) / 1000)
    probe = (
        "import sys, time\n"
        "t = time.perf_counter(); import cantrip; t1 = time.perf_counter()\n"
        "loaded = [m for m in sys.modules if m.startswith('cantrip.llm.providers')]\n"
        "httpx = 'httpx' in sys.modules\n"
        "from cantrip.llm import load_llm\n"
        "t2 = time.perf_counter(); load_llm('openai'); t3 = time.perf_counter()\n"
        "print((t1 - t) * 1000, len(loaded), httpx, (t3 - t2) * 1000)\n"
    )
    plain, first_use = [], []
    loaded_modules, httpx_loaded = 0, False
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ,
        )
        a, n, h, b = proc.stdout.split()
        plain.append(float(a))
        first_use.append(float(b))
        loaded_modules = max(loaded_modules, int(n))
        httpx_loaded = httpx_loaded or h == "True"
    return {
        "importtime_ms": statistics.median(cumulative),
        "wall_ms": statistics.median(plain),
        "provider_modules": loaded_modules,
        "httpx": httpx_loaded,
        "first_load_llm_ms": statistics.median(first_use),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--imports", type=int, default=7)
    args = parser.parse_args()

    print("adapter CPU per call, no network (us; render + build + serialize + parse)")
    print(f"{'provider':<17} {'context':>22} {'query':>9} {'stream':>9}")
    for provider in PROVIDERS:
        llm = load_llm(provider, MODELS[provider], base_url="http://127.0.0.1:9/v1")
        for label, turns, warm in (
            ("2 msgs", 0, False),
            ("102 msgs, first call", 50, False),
            ("102 msgs, next turn", 50, True),
        ):
            q, s = cpu_only(llm, provider, context(turns), args.calls, args.repeats, warm)
            print(f"{provider:<17} {label:>22} {q:>9.1f} {s:>9.1f}")

    print("\nstream parse cost (us; SSE decode + JSON + fold + final parse, no network)")
    print(f"{'provider':<17} {'events':>7} {'per event':>10} {'per stream':>11}")
    for provider in PROVIDERS:
        count, each, total = per_event(provider, args.calls, args.repeats)
        print(f"{provider:<17} {count:>7} {each:>10.2f} {total:>11.1f}")

    print(
        "\nround trip over loopback, zero-latency server (us per call; httpx + h11 server included)"
    )
    print(f"{'provider':<17} {'query':>9} {'stream':>9}")
    for provider, (q, s) in trio.run(round_trips, args.calls, args.repeats).items():
        print(f"{provider:<17} {q:>9.1f} {s:>9.1f}")

    print("\nimport time")
    figures = import_times(args.imports)
    rows = (
        ("python -X importtime -c 'import cantrip' (median)", f"{figures['importtime_ms']:.1f} ms"),
        ("import cantrip, wall clock (median)", f"{figures['wall_ms']:.1f} ms"),
        ("provider modules loaded by 'import cantrip'", str(figures["provider_modules"])),
        ("httpx loaded by 'import cantrip'", str(figures["httpx"])),
        (
            "first load_llm('openai') (httpx, adapter, TOML)",
            f"{figures['first_load_llm_ms']:.1f} ms",
        ),
    )
    for label, value in rows:
        print(f"  {label:<50} {value}")


if __name__ == "__main__":
    main()
