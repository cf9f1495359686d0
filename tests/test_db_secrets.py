"""Issue 28.6 and 28.12: no secret at rest in PostgreSQL under the workers.

A spec's MCP ``env`` values, and a worker's failure message quoting a provider key,
were stored verbatim in ``cantrip_work``. Here a real PostgreSQL, real ``cantrip
worker`` and ``cantrip cast --db`` processes, a real MCP server (tests/mcp_servers) and
a loopback OpenAI server that quotes the key in its 401 (as OpenAI does); then the
whole database is dumped with ``pg_dump`` (run as the cluster's user) and searched
for every secret the test set.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from fake_providers import Answer, Call, serve
from mcp_support import TOOLBOX
from pg_cluster import _as_user, _bin
from test_secrets import KEY, QuotingOpenAI, key_pieces

TESTS = Path(__file__).resolve().parent
MCP_SECRET = "mcp-server-secret-7731-qq"
"""No credential shape: only a redactor that knows where it came from can catch it."""

MCP_SPEC = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "box_env_digest", args = {{ name = "BOX_TOKEN" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "checked" }} }}] }},
]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{{ max_turns = 3 }}]
[[circle.mcp]]
name = "box"
command = "{python}"
args = ["{toolbox}"]
env = {{ BOX_TOKEN = {token} }}
"""

A2A_TOKEN = "tok-remote-4242"
"""What tests/a2a_servers/remote_agent.py requires as ``Authorization: Bearer ...``
(test_a2a_gate.TOKEN); the worker's environment holds it as ``A2A_SECRET``."""

A2A_SPEC = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "travel", args = {{ message = "hello" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "sent" }} }}] }},
]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{{ max_turns = 3 }}]
[[circle.a2a]]
name = "travel"
url = "{url}"
headers = {{ Authorization = {authorization} }}
"""

LLM_SPEC = """
[llm]
provider = "openai"
model = "gpt-4o-mini"
base_url = "{base_url}"
api_key_env = "LLM_CRED"
[circle]
medium = "conversation"
gates = ["done"]
wards = [{{ max_turns = 2 }}]
[retry]
max_retries = 0
"""


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_KEY", "_TOKEN"))}
    return {**env, "PYTHONPATH": str(TESTS), **extra}


@pytest.fixture
def worker(pg_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `cantrip worker` whose environment holds both secrets (as a worker host would)."""
    env = worker_env(LLM_CRED=KEY, MCP_SECRET=MCP_SECRET, A2A_SECRET=A2A_TOKEN)
    env["CANTRIP_PROVIDERS_DIR"] = str(tmp_path / "no-providers")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cantrip", "worker", "--db", pg_url, "--lease", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "worker.log").open("ab"),
    )
    yield proc
    proc.kill()
    proc.wait()


async def cast_on_db(spec: Path, url: str) -> subprocess.CompletedProcess[bytes]:
    """`cantrip cast SPEC --db URL --json` from a process that holds no secret."""
    return await trio.run_process(
        [sys.executable, "-m", "cantrip", "cast", str(spec), "go", "--db", url, "--json"],
        env=worker_env(CANTRIP_PROVIDERS_DIR=str(spec.parent / "no-providers")),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


def pg_dump(url: str) -> bytes:
    """Every table's contents, as the cluster's own user dumps them."""
    return subprocess.run(
        [*_as_user(), _bin("pg_dump"), "--data-only", "-d", url],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout


def toml_string(value: str) -> str:
    return json.dumps(value)


async def test_no_secret_the_test_set_is_anywhere_in_the_database(
    pg_url: str, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    def mcp_spec(token: str) -> Path:
        path = tmp_path / "mcp.toml"
        path.write_text(
            MCP_SPEC.format(python=sys.executable, toolbox=TOOLBOX, token=toml_string(token))
        )
        return path

    # 1. A literal secret in an MCP server's env is refused before anything is queued.
    refused = await cast_on_db(mcp_spec(MCP_SECRET), pg_url)
    assert refused.returncode == 1
    assert refused.stderr.decode().strip() == (
        "cantrip: circle.mcp[0].env.BOX_TOKEN: a spec run by workers is stored in the "
        'database, so give env values as variables ("${NAME}") that each worker reads '
        "from its own environment, not as literal values"
    )
    assert MCP_SECRET.encode() not in refused.stderr

    # 2. A reference travels; the worker resolves it from its own environment.
    ran = await cast_on_db(mcp_spec("${MCP_SECRET}"), pg_url)
    assert ran.returncode == 0, ran.stderr.decode()
    assert json.loads(ran.stdout)["result"] == "checked"
    # 3. A provider whose 401 quotes the key: the worker's failure, stored and printed.
    fake = QuotingOpenAI([Answer(calls=(Call("done", {"answer": "ok"}),))], key="the-right-key")
    async with serve(fake, "/v1") as url:
        (tmp_path / "llm.toml").write_text(LLM_SPEC.format(base_url=url))
        failed = await cast_on_db(tmp_path / "llm.toml", pg_url)
    assert failed.returncode == 1, failed.stderr.decode()
    printed = json.loads(failed.stdout)
    assert printed["state"] == "failed"
    assert "Incorrect API key provided: [REDACTED]" in printed["error"]
    assert KEY.encode() not in failed.stdout + failed.stderr

    dump = pg_dump(pg_url)
    digest = hashlib.sha256(MCP_SECRET.encode()).hexdigest()
    assert digest.encode() in dump, "the MCP server was given the secret (its digest)"
    assert b"${MCP_SECRET}" in dump, "the spec travelled with the reference"
    for secret in (KEY, MCP_SECRET):
        assert secret.encode() not in dump, secret
        assert key_pieces(dump, secret) == [], secret


async def test_an_a2a_header_is_never_stored_in_clear_and_resolves_on_the_worker(
    pg_url: str, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Issue 39.8: a literal A2A ``Authorization`` header was stored in clear in
    ``cantrip_work.spell``. Now it is refused before anything is queued, and its
    ``${NAME}`` form is resolved by the worker, whose request the remote agent accepts."""
    from test_a2a_gate import TOKEN, remote_agent

    assert TOKEN == A2A_TOKEN

    def a2a_spec(url: str, authorization: str) -> Path:
        path = tmp_path / "a2a.toml"
        path.write_text(A2A_SPEC.format(url=url, authorization=toml_string(authorization)))
        return path

    async with remote_agent(tmp_path) as (url, log):
        refused = await cast_on_db(a2a_spec(url, f"Bearer {A2A_TOKEN}"), pg_url)
        assert refused.returncode == 1
        assert refused.stderr.decode().strip() == (
            "cantrip: circle.a2a[0].headers.Authorization: a spec run by workers is stored "
            'in the database, so give headers values as variables ("${NAME}") that each '
            "worker reads from its own environment, not as literal values"
        )
        assert A2A_TOKEN.encode() not in refused.stdout + refused.stderr
        assert A2A_TOKEN.encode() not in pg_dump(pg_url), "nothing was written"

        ran = await cast_on_db(a2a_spec(url, "Bearer ${A2A_SECRET}"), pg_url)
        assert ran.returncode == 0, ran.stderr.decode()
        assert json.loads(ran.stdout)["result"] == "sent"
        assert any(line.startswith("asked ") for line in log.read_text().splitlines()), (
            "the agent took the worker's request: the header carried the token"
        )
    dump = pg_dump(pg_url)
    assert b"Bearer ${A2A_SECRET}" in dump, "the spec travelled with the reference"
    assert A2A_TOKEN.encode() not in dump
    assert key_pieces(dump, A2A_TOKEN) == []


def test_a_reference_to_an_unset_variable_is_a_clear_error_where_the_server_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cantrip import ConstructionError
    from cantrip.mcp import MCPServer

    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    monkeypatch.setenv("SET_HERE", "value-of-set-here-1")
    server = MCPServer(
        name="box",
        command="box-server",
        env={"A": "${SET_HERE}", "B": "prefix-${NOT_SET_ANYWHERE}"},
    )
    with pytest.raises(ConstructionError) as raised:
        server.resolved()
    assert str(raised.value) == (
        "MCP server 'box': env.B names ${NOT_SET_ANYWHERE}, which is not set in this "
        "process's environment"
    )
    monkeypatch.setenv("NOT_SET_ANYWHERE", "there-now-2")
    assert dict(server.resolved().env) == {"A": "value-of-set-here-1", "B": "prefix-there-now-2"}
    from cantrip._redact import redact

    assert redact("there-now-2") == "[REDACTED]", "a referenced variable is a known secret"
