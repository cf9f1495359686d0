"""The smaller first-hour failures (issue 30, item 9), each as a newcomer meets it:
tracing with no collector, a damaged loom, ``cast --db`` with no worker and its
``--json``, PostgreSQL connection errors, a PostgreSQL loom in the loom CLI and the
viewers, and prose in a code medium (the HTTP API's curl example is in
docs/how-to/acp-http.md, run by tests/test_docs.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

import cantrip
import gates
from cantrip import Loom, LoomError, max_turns

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "examples" / "hello.toml"
CANTRIP = str(Path(sys.executable).with_name("cantrip"))
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hello_copy(folder: Path) -> Path:
    """The shipped example in the test's own folder (its loom file lands there)."""
    spec = folder / "hello.toml"
    spec.write_text(HELLO.read_text())
    return spec


def cli(*args: str, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CANTRIP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        **kwargs,  # type: ignore[arg-type]
    )


# -- tracing, looms, code mediums ---------------------------------------------------------


def test_otlp_with_no_collector_says_so_once(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}/v1/traces"
    done = cli("cast", str(hello_copy(tmp_path)), "hi", "--otlp", endpoint)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "I greeted the world."
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"cantrip: cannot send traces to {endpoint} (connection refused); the spans of this "
        "run are dropped -- is the collector running? (said once)"
    ], done.stderr


def test_a_loom_damaged_inside_names_check_and_recover(tmp_path: Path) -> None:
    script = [
        {"tool_calls": [{"gate": "echo", "args": {"text": f"step {i} " + "x" * 300}}]}
        for i in range(119)
    ] + [{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]
    loom = Loom.open(tmp_path / "big.db")
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([gates.done, gates.echo], [max_turns(121)]),
        loom=loom,
    )
    trio.run(spell.cast_async, "go")
    loom.close()
    data = bytearray((tmp_path / "big.db").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8192] = b"\x55" * 8192  # pages in the middle, not the header
    damaged = tmp_path / "mid.db"
    damaged.write_bytes(bytes(data))
    done = cli("loom", str(damaged), "list", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "malformed" in done.stderr
    assert f"cantrip loom {damaged} check" in done.stderr
    assert f"cantrip loom {damaged} recover NEW.db" in done.stderr
    assert damaged.read_bytes() == bytes(data), "the damaged file is only read"


def test_prose_to_a_code_medium_is_said(tmp_path: Path) -> None:
    spec = tmp_path / "code.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = [{ content = "done(\'hi\')" }]\n'
        '[circle]\nmedium = "python"\ngates = ["done"]\nwards = [{ max_turns = 3 }]\n'
    )
    done = cli("cast", str(spec), "go")
    assert done.returncode == 0
    assert "the code medium received prose, not code" in done.stderr
    assert 'code = "..."' in done.stderr
    spec.write_text(spec.read_text().replace("content =", "code ="))
    done = cli("cast", str(spec), "go")
    assert done.stdout.strip() == "hi" and "prose" not in done.stderr


# -- PostgreSQL -----------------------------------------------------------------------------


def test_postgres_connection_errors_name_their_cause(pg_server: str) -> None:
    port = closed_port()
    started = time.monotonic()
    with pytest.raises(LoomError) as refused:
        Loom.open(f"postgresql://postgres:secret-pw@127.0.0.1:{port}/x")
    elapsed = time.monotonic() - started
    message = str(refused.value)
    assert "connection refused" in message and f"127.0.0.1:{port}" in message
    assert "secret-pw" not in message and "pool initialization" not in message
    assert elapsed < 8, elapsed  # the pool alone took 10 s (a bound, not a benchmark)
    base = pg_server.rsplit("/", 1)[0]
    with pytest.raises(LoomError, match="no such database 'no_such_db'"):
        Loom.open(base + "/no_such_db")
    nobody = base.replace("postgres@", "nobody@") + "/postgres"
    with pytest.raises(LoomError, match="no such user 'nobody'"):
        Loom.open(nobody)


def test_loom_commands_on_a_database_without_a_loom_leave_it_untouched(pg_url: str) -> None:
    """A mistyped database name must not get cantrip's tables: reading commands (and
    the viewer) refuse a database that holds no loom, and create nothing in it."""
    import psycopg

    for command in (("list",), ("stats",), ("view", "--port", "0")):
        done = cli("loom", pg_url, *command, timeout=60)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "no cantrip loom in the database" in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr
    with psycopg.connect(pg_url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)


def test_cast_db_says_when_no_worker_takes_the_work(pg_url: str, tmp_path: Path) -> None:
    process = subprocess.Popen(
        [CANTRIP, "cast", str(hello_copy(tmp_path)), "hi", "--db", pg_url],
        stderr=subprocess.PIPE,
        env=ENV,
    )
    try:
        assert process.stderr is not None
        said = ""
        deadline = time.monotonic() + 60
        while "no worker has taken" not in said:
            assert time.monotonic() < deadline, f"nothing said about a worker: {said!r}"
            ready, _, _ = select.select([process.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(process.stderr.fileno(), 4096)
                assert chunk, f"the command ended: {said!r}"
                said += chunk.decode()
        told = said.splitlines()[-1]
        assert "start one with: cantrip worker --db URL" in told
        assert pg_url not in said
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def worker(pg_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    process = subprocess.Popen(
        [CANTRIP, "worker", "--db", pg_url],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "worker.log").open("ab"),
        env=ENV,
    )
    yield process
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_cast_db_json_has_the_shape_of_cast_json_and_the_loom_cli_reads_it(
    pg_url: str, tmp_path: Path, worker: subprocess.Popen[bytes]
) -> None:
    spec = hello_copy(tmp_path)
    local = cli("cast", str(spec), "hi", "--json")
    queued = cli("cast", str(spec), "hi", "--json", "--db", pg_url)
    assert local.returncode == 0 and queued.returncode == 0, queued.stderr
    here, there = json.loads(local.stdout), json.loads(queued.stdout)
    assert list(there)[2:] == list(here), "the same keys, in the same order, after state/work_id"
    assert list(there)[:2] == ["state", "work_id"]
    for key in ("result", "terminated", "reason", "stop_reason", "turns", "usage", "summary"):
        assert there[key] == here[key], key
    assert there["loom"].startswith("postgresql://") and "@" in there["loom"]

    # The loom command reads the PostgreSQL loom the URL names (it used to fold the //).
    listed = cli("loom", pg_url, "list")
    assert listed.returncode == 0, listed.stderr
    assert there["entity_id"] in listed.stdout
    shown = cli("loom", pg_url, "show", there["entity_id"])
    assert shown.returncode == 0 and "I greeted the world." in shown.stdout
    check = cli("loom", pg_url, "check")
    assert check.returncode == 1 and "PostgreSQL" in check.stderr

    # The read-only viewer over the PostgreSQL loom.
    async def view() -> list[str]:
        from cantrip.protocols.viewer._app import serve_viewer

        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve_viewer, pg_url)
            async with httpx.AsyncClient(base_url=binds[0], timeout=30) as http:
                page = await http.get("/")
                assert page.status_code == 200 and "text/html" in page.headers["content-type"]
                listing = (await http.get("/api/entities")).json()
            nursery.cancel_scope.cancel()
        return [e["entity_id"] for e in listing["items"]]

    assert there["entity_id"] in trio.run(view)


def test_serve_db_serves_the_viewer(pg_url: str, tmp_path: Path) -> None:
    spec = hello_copy(tmp_path)
    seeded = Loom.open(pg_url)
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "x"}}]}]),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([gates.done], [max_turns(2)]),
        loom=seeded,
    )
    entity_id = spell.cast("seed").entity_id
    seeded.close()
    port = closed_port()
    process = subprocess.Popen(
        [CANTRIP, "serve", str(spec), "--db", pg_url, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "replica.log").open("ab"),
        env=ENV,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "replica.log").read_text()
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        page = httpx.get(base + "/", timeout=10)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        listing = httpx.get(base + "/api/entities", timeout=10).json()
        assert entity_id in [e["entity_id"] for e in listing["items"]]
        thread = httpx.get(base + f"/api/entities/{entity_id}/tree", timeout=10)
        assert thread.status_code == 200, thread.text
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
