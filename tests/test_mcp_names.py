"""MCP tool names that LLM providers refuse become gate names they accept (issue 28, item 9).

The server (``mcp_servers/oddnames.py``, official SDK) names its tools with spaces,
``/``, ``<``, a newline, a dot, a leading digit and 80 characters. Before, those names
went to the provider unchanged and it refused every request of the cast; now each is
mapped by the rule SPEC.md states (MCP-2): kept when it already fits
``[A-Za-z_][A-Za-z0-9_-]{0,63}``, else characters outside it become ``_``, the name is
cut to 55 and ``_`` + the first 8 hex digits of the tool name's SHA-256 is appended.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fake_providers import Answer, Call, isolate, running
from mcp_support import ODDNAMES, PYTHON

import cantrip
from cantrip.cli._main import main as cli_main
from cantrip.mcp import MCPServer
from gates import done

ACCEPTED = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
LONG = "long_" + "x" * 75
NEWLINE = "line\nbreak"


def h(tool: str) -> str:
    return hashlib.sha256(tool.encode()).hexdigest()[:8]


EXPECTED = {
    "od_plain": "plain",
    "od_9lives": "9lives",
    f"od_get_weather_{h('get weather')}": "get weather",
    f"od_fs_read_{h('fs/read')}": "fs/read",
    f"od_a_b__{h('a<b>')}": "a<b>",
    f"od_line_break_{h(NEWLINE)}": NEWLINE,
    f"od_github_create_issue_{h('github.create_issue')}": "github.create_issue",
    f"od_{LONG}"[:55] + f"_{h(LONG)}": LONG,
}


def oddnames(**options: Any) -> MCPServer:
    return MCPServer(name="od", command=PYTHON, args=[str(ODDNAMES)], **options)


def spell(llm: Any, *servers: MCPServer) -> cantrip.Cantrip:
    circle = cantrip.Circle([done], [cantrip.max_turns(4)], providers=servers)
    return cantrip.Cantrip(llm=llm, identity=cantrip.Identity(), circle=circle)


async def test_every_presented_name_is_accepted_and_the_mapping_is_stable() -> None:
    seen: list[list[str]] = []

    class Recording(cantrip.ScriptedLLM):
        async def query(self, messages: Any, tools: Any = (), *rest: Any, **kw: Any) -> Any:
            seen.append([t.name for t in tools])
            return await super().query(messages, tools, *rest, **kw)

    script = [
        {"tool_calls": [{"gate": gate, "args": {}} for gate in EXPECTED]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
    ]
    for _ in range(2):  # two casts, two server starts: the same names
        outcome = await spell(Recording(script), oddnames()).cast_async("names")
        assert outcome.result == "ok"
        records = outcome.turns[0].gate_calls
        # The loom keeps the name the model saw and the one the server was asked for.
        assert {r.gate: dict(r.detail)["mcp_tool"] for r in records} == EXPECTED
        assert all(r.result == f"I am {dict(r.detail)['mcp_tool']!r}" for r in records)
        assert not any(r.is_error for r in records)
    assert seen[0] == seen[2], "stable across server starts"
    assert set(seen[0]) == {"done", *EXPECTED}
    assert all(ACCEPTED.fullmatch(name) for name in seen[0])


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_a_provider_that_checks_names_accepts_the_cast(
    provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolate(monkeypatch, tmp_path)
    weather = f"od_get_weather_{h('get weather')}"
    script = [
        Answer(calls=(Call(weather, {}),)),
        Answer(calls=(Call("done", {"answer": "sunny"}),)),
    ]
    async with running(provider, script) as (_fake, llm):
        outcome = await spell(llm, oddnames()).cast_async("weather?")
    assert outcome.terminated and outcome.result == "sunny", outcome.summary
    record = outcome.turns[0].gate_calls[0]
    assert (record.gate, record.result) == (weather, "I am 'get weather'")


async def test_two_tools_that_would_share_a_gate_name_are_a_start_error() -> None:
    clash = f"get_weather_{h('get weather')}"  # what "get weather" maps to (empty prefix)
    server = oddnames(prefix="", env={"ODDNAMES_EXTRA": json.dumps([clash])})
    s = spell(cantrip.ScriptedLLM([{"content": "unused"}]), server)
    with pytest.raises(cantrip.ProviderStartError) as raised:
        await s.cast_async("go")
    assert str(raised.value) == (
        f"MCP server 'od': tools 'get weather' and {clash!r} would both be the gate "
        f"{clash!r}; leave one out of the allow-list (tools = [...])"
    )
    assert list(s.loom.turns) == []


def test_a_prefix_providers_would_refuse_is_a_spec_error() -> None:
    with pytest.raises(cantrip.ConstructionError, match=r"prefix 'web\.' must start with"):
        MCPServer(name="x", command="y", prefix="web.")
    assert MCPServer(name="x", command="y", prefix="").gate_prefix == ""


def test_cast_check_starts_the_servers_and_shows_the_renamed_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f"""
[llm]
provider = "scripted"
responses = [{{ content = "unused" }}]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{{ max_turns = 2 }}]
[[circle.mcp]]
name = "od"
command = {json.dumps(PYTHON)}
args = [{json.dumps(str(ODDNAMES))}]
tools = ["plain", "get weather", "line\\nbreak"]
"""
    )
    assert cli_main(["cast", str(spec), "--check"]) == 0
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    weather, newline = f"od_get_weather_{h('get weather')}", f"od_line_break_{h(NEWLINE)}"
    assert lines == [
        f"ok: {spec} loads (medium conversation; gates done, od_plain, {weather}, {newline}; "
        "loom in memory)",
        f"  {weather}: tool 'get weather' of 'od' (renamed: LLM providers refuse its name)",
        f"  {newline}: tool 'line\\nbreak' of 'od' (renamed: LLM providers refuse its name)",
    ]


def test_cast_check_reports_a_server_that_fails_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        """
[llm]
provider = "scripted"
responses = [{ content = "unused" }]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 2 }]
[[circle.mcp]]
name = "ghost"
command = "/no/such/server"
"""
    )
    assert cli_main(["cast", str(spec), "--check"]) == 1
    err = capsys.readouterr().err
    assert "MCP server 'ghost' (stdio: /no/such/server) failed to start" in err
    assert "Traceback" not in err
