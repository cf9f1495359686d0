"""The gate decorator and the built-in gates."""

from __future__ import annotations

import http.server
import importlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
import gates
from cantrip import ConstructionError, Gate, GateArgumentError, GateError, gate

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

# -- schema and description ------------------------------------------------------


def test_schema_derived_from_type_hints() -> None:
    @gate
    def search(query: str, limit: int, ratio: float = 0.5, tags: list[str] | None = None) -> str:
        """Search the index.

        Returns matching lines.
        """
        return query

    assert isinstance(search, Gate)
    assert search.name == "search"
    schema = dict(search.parameters)
    assert schema["type"] == "object"
    assert schema["required"] == ["query", "limit"]
    props = schema["properties"]
    assert set(props) == {"query", "limit", "ratio", "tags"}
    assert props["query"]["type"] == "string"
    assert props["limit"]["type"] == "integer"
    assert props["ratio"] == {"type": "number", "default": 0.5}
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert "title" not in schema
    assert "title" not in props["query"]


def test_description_from_docstring_and_override() -> None:
    @gate
    def documented(x: int) -> int:
        """Double the number.

        More detail here.
        """
        return x * 2

    @gate(name="renamed", description="An explicit description.")
    def other(x: int) -> int:
        """Ignored docstring."""
        return x

    @gate
    def undocumented(x: int) -> int:
        return x

    assert documented.description == "Double the number.\n\nMore detail here."
    assert other.name == "renamed"
    assert other.description == "An explicit description."
    assert undocumented.description == ""
    definition = documented.definition()
    assert definition.name == "documented"
    assert definition.description.startswith("Double the number.")
    assert definition.to_dict()["parameters"]["required"] == ["x"]


def test_gate_with_no_parameters_has_an_empty_object_schema() -> None:
    @gate
    def ping() -> str:
        """Ping."""
        return "pong"

    assert dict(ping.parameters)["type"] == "object"
    assert dict(ping.parameters)["properties"] == {}
    assert "required" not in ping.parameters


# -- dependencies ----------------------------------------------------------------


def _lookup_gate() -> Gate:
    @gate(dependencies=("table", "suffix"))
    def lookup(key: str, table: dict[str, str], suffix: str = "!") -> str:
        """Look a key up."""
        return table[key] + suffix

    return lookup


def test_dependencies_are_excluded_from_schema() -> None:
    lookup = _lookup_gate()
    assert set(lookup.parameters["properties"]) == {"key"}
    assert lookup.parameters["required"] == ["key"]
    assert lookup.dependencies == ("table", "suffix")
    # a dependency with a default is bound already; the other one is missing
    assert lookup.missing_dependencies == ["table"]


async def test_bind_supplies_dependencies() -> None:
    lookup = _lookup_gate()
    bound = lookup.bind(table={"a": "alpha"})
    assert bound.missing_dependencies == []
    assert await bound.invoke({"key": "a"}) == "alpha!"
    rebound = bound.bind(suffix="?")
    assert await rebound.invoke({"key": "a"}) == "alpha?"
    # bind returns a copy; the original is untouched
    assert lookup.missing_dependencies == ["table"]
    assert await bound.invoke({"key": "a"}) == "alpha!"


async def test_a_dependency_cannot_be_passed_as_an_argument() -> None:
    bound = _lookup_gate().bind(table={"a": "alpha"})
    with pytest.raises(GateArgumentError, match="unexpected argument 'table'"):
        await bound.invoke({"key": "a", "table": {"a": "evil"}})


def test_bind_unknown_dependency_raises() -> None:
    lookup = _lookup_gate()
    with pytest.raises(ConstructionError, match="no dependency 'tabel'") as info:
        lookup.bind(tabel={})
    assert "table, suffix" in str(info.value)


def test_declared_dependency_must_be_a_parameter() -> None:
    with pytest.raises(ConstructionError, match="dependencies it does not take"):

        @gate(dependencies=("root",))
        def nothing(x: int) -> int:
            return x


def test_var_args_cannot_be_presented() -> None:
    with pytest.raises(ConstructionError, match=r"\*args/\*\*kwargs"):

        @gate
        def splat(*args: int) -> int:
            return sum(args)


def test_circle_refuses_unbound_dependencies() -> None:
    with pytest.raises(ConstructionError, match="needs its dependencies bound") as info:
        cantrip.Circle([gates.done, _lookup_gate()], [cantrip.max_turns(3)])
    assert "table" in str(info.value)


# -- validation ------------------------------------------------------------------


@gate
def add(x: int, y: int = 1) -> int:
    """Add two numbers."""
    return x + y


async def test_missing_required_argument() -> None:
    with pytest.raises(GateArgumentError, match="missing required argument 'x'") as info:
        await add.invoke({})
    assert "'add'" in str(info.value)


async def test_unexpected_argument() -> None:
    with pytest.raises(GateArgumentError, match="unexpected argument 'z'"):
        await add.invoke({"x": 1, "z": 2})


async def test_type_error() -> None:
    with pytest.raises(GateArgumentError, match="argument 'x'") as info:
        await add.invoke({"x": "not a number"})
    assert "integer" in str(info.value)


async def test_several_problems_are_reported_together() -> None:
    with pytest.raises(GateArgumentError) as info:
        await add.invoke({"y": "nope", "w": 0})
    message = str(info.value)
    assert "missing required argument 'x'" in message
    assert "argument 'y'" in message
    assert "unexpected argument 'w'" in message


async def test_validated_arguments_reach_the_function() -> None:
    assert await add.invoke({"x": 2}) == 3
    assert await add.invoke({"x": 2, "y": 5}) == 7


async def test_the_function_does_not_run_when_validation_fails() -> None:
    calls: list[int] = []

    @gate
    def record(x: int) -> int:
        calls.append(x)
        return x

    with pytest.raises(GateArgumentError):
        await record.invoke({"x": "abc"})
    assert calls == []


# -- sync, async and blocking gates ----------------------------------------------


async def test_async_gate() -> None:
    @gate
    async def slow_upper(text: str) -> str:
        """Upper-case after a checkpoint."""
        await trio.sleep(0)
        return text.upper()

    assert await slow_upper.invoke({"text": "hi"}) == "HI"


async def test_sync_gate_runs_on_the_trio_thread() -> None:
    seen: list[threading.Thread] = []

    @gate
    def where(x: int) -> int:
        seen.append(threading.current_thread())
        return x

    assert await where.invoke({"x": 4}) == 4
    assert seen == [threading.current_thread()]


async def test_blocking_gate_runs_in_a_worker_thread() -> None:
    seen: list[threading.Thread] = []

    @gate(blocking=True)
    def blocking_read(x: int) -> int:
        """Pretend to block."""
        seen.append(threading.current_thread())
        return x * 10

    assert blocking_read.blocking
    assert await blocking_read.invoke({"x": 4}) == 40
    assert len(seen) == 1
    assert seen[0] is not threading.current_thread()


async def test_sync_gate_returning_an_awaitable_is_awaited() -> None:
    async def later(x: int) -> int:
        return x + 100

    @gate
    def deferred(x: int) -> Any:
        return later(x)

    assert await deferred.invoke({"x": 1}) == 101


async def test_gate_exceptions_propagate_from_invoke() -> None:
    @gate
    def broken(x: int) -> int:
        raise GateError(f"cannot handle {x}")

    with pytest.raises(GateError, match="cannot handle 3"):
        await broken.invoke({"x": 3})


# -- built-in gates: done and echo -----------------------------------------------


async def test_done_returns_its_answer() -> None:
    assert gates.done.terminates
    assert await gates.done.invoke({"answer": "42"}) == "42"
    assert await gates.done.invoke({"answer": {"a": [1, 2]}}) == {"a": [1, 2]}
    with pytest.raises(GateArgumentError, match="missing required argument 'answer'"):
        await gates.done.invoke({})


async def test_echo_returns_its_text() -> None:
    assert not gates.echo.terminates
    assert await gates.echo.invoke({"text": "hello"}) == "hello"
    assert gates.echo.parameters["required"] == ["text"]


def test_builtin_registry() -> None:
    assert set(gates.BUILTIN) == {
        "done",
        "echo",
        "read",
        "fetch",
        "call_agent",
        "call_agent_batch",
        "ask_user",
        "remember",
        "recall",
        "forget",
        "edit_block",
    }
    assert gates.BUILTIN["call_agent"].delegates and "call_entity" in gates.call_agent.aliases
    assert gates.BUILTIN["done"] is gates.done


# -- built-in gates: read --------------------------------------------------------


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "hello.txt").write_text("hello from inside")
    (root / "sub" / "nested.txt").write_text("nested")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("not the real passwd")
    (tmp_path / "outside.txt").write_text("SECRET outside the root")
    return root


async def test_read_inside_root(data_root: Path) -> None:
    read = gates.read.bind(root=str(data_root))
    assert await read.invoke({"path": "hello.txt"}) == "hello from inside"
    assert await read.invoke({"path": "sub/nested.txt"}) == "nested"
    assert await read.invoke({"path": "sub/../hello.txt"}) == "hello from inside"
    assert "root" not in read.parameters["properties"]


@pytest.mark.parametrize("path", ["../outside.txt", "sub/../../outside.txt"])
async def test_read_refuses_parent_escape(data_root: Path, path: str) -> None:
    read = gates.read.bind(root=str(data_root))
    with pytest.raises(GateError, match="outside"):
        await read.invoke({"path": path})


async def test_read_absolute_path_maps_inside_root(data_root: Path) -> None:
    read = gates.read.bind(root=str(data_root))
    assert await read.invoke({"path": "/etc/passwd"}) == "not the real passwd"
    assert await read.invoke({"path": "/hello.txt"}) == "hello from inside"


async def test_read_absolute_path_to_missing_file_does_not_escape(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    read = gates.read.bind(root=str(root))
    with pytest.raises(GateError, match="ENOENT"):
        await read.invoke({"path": "/etc/hostname"})
    outside = tmp_path / "outside.txt"
    outside.write_text("SECRET")
    with pytest.raises(GateError, match="ENOENT"):
        await read.invoke({"path": str(outside)})


async def test_read_refuses_symlink_out_of_root(data_root: Path, tmp_path: Path) -> None:
    (data_root / "link.txt").symlink_to(tmp_path / "outside.txt")
    (data_root / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    read = gates.read.bind(root=str(data_root))
    with pytest.raises(GateError, match="outside"):
        await read.invoke({"path": "link.txt"})
    with pytest.raises(GateError, match="outside"):
        await read.invoke({"path": "linkdir/outside.txt"})


async def test_read_follows_symlink_inside_root(data_root: Path) -> None:
    (data_root / "alias.txt").symlink_to(data_root / "hello.txt")
    read = gates.read.bind(root=str(data_root))
    assert await read.invoke({"path": "alias.txt"}) == "hello from inside"


async def test_read_missing_file_is_enoent(data_root: Path) -> None:
    read = gates.read.bind(root=str(data_root))
    with pytest.raises(GateError, match="ENOENT") as info:
        await read.invoke({"path": "nope.txt"})
    assert "nope.txt" in str(info.value)


async def test_read_directory_is_eisdir(data_root: Path) -> None:
    read = gates.read.bind(root=str(data_root))
    with pytest.raises(GateError, match="EISDIR"):
        await read.invoke({"path": "sub"})


async def test_read_refuses_a_fifo_without_blocking_the_loop(data_root: Path) -> None:
    """A FIFO below the root used to hang the whole process: read opened it on the
    trio thread, twice. The loop watch (this module's mark) fails the test if the loop
    blocks; a writer thread unblocks an opener, so an old gate returns "" late."""
    fifo = data_root / "pipe"
    os.mkfifo(fifo)
    stop = threading.Event()

    def unblock_openers() -> None:
        while not stop.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                time.sleep(0.05)  # no reader yet (ENXIO)

    read = gates.read.bind(root=str(data_root))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, unblock_openers)
        await trio.sleep(0.05)  # the writer thread is running before read is called
        try:
            with pytest.raises(GateError) as info:
                await read.invoke({"path": "pipe"})
        finally:
            stop.set()
    assert str(info.value) == "'pipe' is not a regular file (a FIFO); read opens only files"


async def test_read_refuses_a_socket_and_says_what_it_is(data_root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(data_root / "sock"))
        read = gates.read.bind(root=str(data_root))
        with pytest.raises(GateError) as info:
            await read.invoke({"path": "sock"})
    assert str(info.value) == "'sock' is not a regular file (a socket); read opens only files"


async def test_read_refuses_a_device(tmp_path: Path) -> None:
    read = gates.read.bind(root="/dev")  # a root that holds devices: still only files
    with pytest.raises(GateError) as info:
        await read.invoke({"path": "null"})
    assert str(info.value) == "'null' is not a regular file (a device); read opens only files"


async def test_read_runs_in_a_worker_thread_and_gives_up_after_its_timeout(
    data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_module = importlib.import_module("gates.read")  # gates.read is also the gate

    seen: list[threading.Thread] = []
    release = threading.Event()
    real = read_module._read_file

    def slow(*args: Any) -> str:
        seen.append(threading.current_thread())
        release.wait(10)  # a hung file system
        return real(*args)

    monkeypatch.setattr(read_module, "_read_file", slow)
    read = gates.read.bind(root=str(data_root), timeout_s=0.3)
    try:
        with pytest.raises(GateError) as info:
            await read.invoke({"path": "hello.txt"})
    finally:
        release.set()
    assert str(info.value) == "read 'hello.txt' took longer than 0.3 s; gave up"
    assert seen and seen[0] is not threading.current_thread()


# -- built-in gates: fetch -------------------------------------------------------


class _NoNetwork:
    """Stands in for httpx.AsyncClient: any attempt to build a client fails the test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("fetch tried to open an HTTP client for a refused URL")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpx, "AsyncClient", _NoNetwork)


async def test_fetch_allows_nothing_by_default(no_network: None) -> None:
    assert gates.fetch.missing_dependencies == []
    with pytest.raises(GateError, match=re.escape("'example.com' is not allowed")) as info:
        await gates.fetch.invoke({"url": "https://example.com/data"})
    assert "none" in str(info.value)


async def test_fetch_refuses_hosts_not_in_allow_list(no_network: None) -> None:
    fetch = gates.fetch.bind(allow_hosts=("api.example.org",))
    with pytest.raises(GateError, match=re.escape("'evil.example.net' is not allowed")) as info:
        await fetch.invoke({"url": "http://evil.example.net/steal"})
    assert "api.example.org" in str(info.value)
    # a suffix trick does not pass as the allowed host
    with pytest.raises(GateError, match=re.escape("'api.example.org.evil.net'")):
        await fetch.invoke({"url": "https://api.example.org.evil.net/"})


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "not a url"])
async def test_fetch_refuses_non_http_urls(no_network: None, url: str) -> None:
    fetch = gates.fetch.bind(allow_hosts=("*",))
    with pytest.raises(GateError, match="http"):
        await fetch.invoke({"url": url})


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 404 if self.path == "/missing" else 200
        body = f"served {self.path}".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def loopback_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def test_fetch_allowed_loopback_host(loopback_server: int) -> None:
    assert os.environ.get("NO_PROXY") == "127.0.0.1"
    fetch = gates.fetch.bind(allow_hosts=("127.0.0.1",), timeout_s=5.0)
    body = await fetch.invoke({"url": f"http://127.0.0.1:{loopback_server}/hello"})
    assert body == "served /hello"
    with pytest.raises(GateError, match="HTTP 404"):
        await fetch.invoke({"url": f"http://127.0.0.1:{loopback_server}/missing"})
