"""What cantrip takes from its dependencies beyond their public API, checked loudly.

Every import of a dependency's private module, and every private attribute of a
dependency that cantrip's code touches, is listed here with the versions it was
tested on (pinned in pyproject.toml). An upgrade that moves or changes one fails
these tests by name, not a user's server or cast at run time; a new private touch
fails :func:`test_cantrip_imports_no_private_module_of_a_dependency` until it is
listed (or replaced by a public API).
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import pathlib
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("cantrip", "gates", "mediums")
FIRST_PARTY = {*PACKAGES, "__future__"}


def _requirements() -> list[Requirement]:
    """Every requirement of the core and of the extras (not an extra's own name)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += [line for line in extra if not line.startswith("cantrip-runtime")]
    return [Requirement(line) for line in lines]


def _sources() -> list[pathlib.Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def test_cantrip_imports_no_private_module_of_a_dependency() -> None:
    """``import x._y`` / ``from x._y import z`` of another package: none (the MCP SDK's
    ``mcp.shared._httpx_utils`` and httpx's decoders were, and are replaced)."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] not in FIRST_PARTY and any(p.startswith("_") for p in parts[1:]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert found == []


def test_every_third_party_import_is_declared() -> None:
    """``h11`` was imported by the wire path without being declared (and anyio,
    mcp-types, httpcore, protobuf, starlette by others): every module cantrip imports
    comes from a distribution pyproject.toml declares (or an extra does), or from the
    standard library."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += [line for line in extra if not line.startswith("cantrip-runtime")]
    declared = {canonicalize_name(Requirement(line).name) for line in lines}
    providers = importlib.metadata.packages_distributions()
    missing = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            elif isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            else:
                continue
            for top in tops:
                if top in FIRST_PARTY or top in sys.stdlib_module_names:
                    continue
                # the distributions that install ``top`` (some wheels name none: then
                # the distribution named like the module)
                dists = {canonicalize_name(d) for d in providers.get(top, [])}
                dists.add(canonicalize_name(top))
                if not dists & declared:
                    missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert sorted(missing) == [], sorted(missing)


# -- hypercorn: TCPServer._read_data (cantrip.protocols.middleware._hypercorn)


def test_hypercorn_is_pinned_to_the_release_whose_internals_we_override() -> None:
    """In every extra that brings it (``serve``, ``mcp``)."""
    requirements = [r for r in _requirements() if canonicalize_name(r.name) == "hypercorn"]
    assert len(requirements) >= 2
    installed = Version(importlib.metadata.version("hypercorn"))
    for requirement in requirements:
        assert installed in requirement.specifier, (
            f"hypercorn {installed} is outside the tested range {requirement.specifier}"
        )
        # The pin has an upper bound: a new release must be tested before it is allowed.
        assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier)


def test_hypercorn_tcp_server_still_has_what_the_hang_up_fix_overrides() -> None:
    """The fix subclasses ``hypercorn.trio.tcp_server.TCPServer``, overrides its
    ``_read_data(self)`` coroutine (the read loop, which returns at EOF) and then stops
    its ``idle_task`` (the keep-alive timer); the worker builds connections from
    ``hypercorn.trio.run.TCPServer``, where :func:`install` puts the subclass."""
    import hypercorn.trio.run as worker
    from hypercorn.trio.tcp_server import TCPServer

    read_data = TCPServer.__dict__.get("_read_data")
    assert read_data is not None and inspect.iscoroutinefunction(read_data)
    assert list(inspect.signature(read_data).parameters) == ["self"]
    assert "self.idle_task = " in inspect.getsource(TCPServer.__init__)
    assert "await self._read_data()" in inspect.getsource(TCPServer.run)
    from hypercorn.trio.tcp_server import TrioSingleTask  # type: ignore[attr-defined]

    assert inspect.iscoroutinefunction(TrioSingleTask.stop)
    assert worker.TCPServer in (TCPServer, *TCPServer.__subclasses__())

    from cantrip.protocols.middleware import _hypercorn

    _hypercorn.install()
    assert issubclass(worker.TCPServer, TCPServer) and worker.TCPServer is not TCPServer
    assert "_read_data" in worker.TCPServer.__dict__


# -- httpx: cookies shared by the pool's clients (public API now) ------------------------


async def test_the_pools_httpx_clients_share_one_cookie_jar() -> None:
    """A client made by the pool (where a proxy keeps httpx) keeps the pool's jar through
    httpx's public ``cookies=CookieJar`` (the same jar, not a copy): a cookie one
    response sets is in every client's cookies."""
    import httpx

    from cantrip.llm.providers._clients import Cookies, client

    jar = Cookies()
    first, second = client(jar), client(jar)
    try:
        assert first.cookies.jar is jar.jar and second.cookies.jar is jar.jar
        response = httpx.Response(
            200,
            headers=[("set-cookie", "cf=abc; Path=/")],
            request=httpx.Request("POST", "https://example.test/v1"),
        )
        first.cookies.extract_cookies(response)
        assert dict(second.cookies) == {"cf": "abc"} == dict(jar)
        built = second.build_request("POST", "https://example.test/v1")
        assert built.headers["cookie"] == "cf=abc"
    finally:
        await first.aclose()
        await second.aclose()


# -- the MCP SDK: its HTTP client (public API now) ---------------------------------------


async def test_the_mcp_http_client_is_the_one_the_sdk_would_make() -> None:
    """cantrip builds the streamable-HTTP client itself (the SDK documents passing one)
    with the SDK's default timeouts, which it publishes as constants."""
    from mcp.client.streamable_http import streamable_http_client

    from cantrip.mcp._connection import MCP_READ_TIMEOUT, MCP_TIMEOUT, http_client

    assert "http_client" in inspect.signature(streamable_http_client).parameters
    made = http_client({"x-key": "v"})
    try:
        assert made.headers["x-key"] == "v"
        assert (made.timeout.connect, made.timeout.read) == (MCP_TIMEOUT, MCP_READ_TIMEOUT)
        assert (MCP_TIMEOUT, MCP_READ_TIMEOUT) == (30.0, 300.0)
    finally:
        await made.aclose()
