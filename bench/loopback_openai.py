"""A loopback OpenAI-compatible server for benchmarks: answers after a fixed delay.

Run: ``python bench/loopback_openai.py --delay 0.05``. It binds 127.0.0.1 on an
ephemeral port, prints ``port <n>`` on stdout, and serves ``POST
/chat/completions`` (non-streaming ``chat.completion`` JSON) until stdin closes
(then it prints ``cpu <seconds>``, the CPU time it used). Every answer comes
``--delay`` seconds after the request was read, so a client waits on a real
socket the way it waits on a provider.

The script: from the request's messages (system, intent, then an assistant
message and a tool result per earlier turn) it tells which turn the caller is
on, and answers ``echo`` for the first ``--turns - 1`` turns, then ``done`` --
the same answers ``bench/concurrency.py``'s in-process LLM gives.

It also answers ``GET /wait`` with a small body after the same delay: the
bare-trio floor's request, with no JSON to parse on either side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import h11
import trio

MAX_REQUEST = 16 * 1024 * 1024


def answer(body: bytes, turns: int | None = None) -> bytes:
    """The completion for one request body: ``echo`` until the cast's last turn, then ``done``.

    ``turns`` of ``None``: the cast's length is read from its system prompt, which
    ends with ``turns=<n>`` (``bench/realsocket.py`` runs casts of several lengths
    against one server)."""
    request = json.loads(body)
    messages = request.get("messages") or []
    if turns is None:
        turns = int(messages[0]["content"].rpartition("turns=")[2])
    answered = (len(messages) - 2) // 2
    if answered + 1 >= turns:
        name, arguments = "done", {"answer": "ok"}
    else:
        name, arguments = "echo", {"text": "step"}
    payload = {
        "id": f"chatcmpl-bench-{answered}",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model", "bench"),
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{answered}",
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return json.dumps(payload).encode()


async def handle(stream: trio.SocketStream, delay: float, turns: int) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
    try:
        while True:
            request: h11.Request | None = None
            body = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            await trio.sleep(delay)
            if request.target == b"/wait":
                content, kind = b"ok", b"text/plain"
            elif request.target.endswith(b"/chat/completions"):
                content, kind = answer(bytes(body), turns), b"application/json"
            else:
                content, kind = b'{"error": {"message": "not found"}}', b"application/json"
            status = 404 if content.startswith(b'{"error"') else 200
            headers = [(b"content-type", kind), (b"content-length", str(len(content)).encode())]
            out = conn.send(h11.Response(status_code=status, headers=headers))
            out = (out or b"") + (conn.send(h11.Data(data=content)) or b"")
            out += conn.send(h11.EndOfMessage()) or b""
            await stream.send_all(out)
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
        return
    finally:
        await stream.aclose()


async def serve(delay: float, turns: int) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=65535)
    port = listeners[0].socket.getsockname()[1]
    print(f"port {port}", flush=True)

    async def until_stdin_closes() -> None:
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(until_stdin_closes)
        nursery.start_soon(trio.serve_listeners, lambda s: handle(s, delay, turns), listeners)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    trio.run(serve, args.delay, args.turns)
    print(f"cpu {time.process_time():.3f}", flush=True)  # for the benchmark's report


if __name__ == "__main__":
    main()
