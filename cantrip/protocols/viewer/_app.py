"""The loom viewer in the browser: static pages plus the paged JSON API.

One more front end over the session layer (SPEC.md "The loom viewer"), in two settings:

* ``cantrip loom FILE view`` -- :func:`serve_viewer`: a read-only local server
  over a loom file (reopened when the file grows, so a running cast's new turns
  show up), which prints its URL and opens nothing by itself;
* ``cantrip serve`` (either mode) -- :meth:`Viewer.over` the session backend is
  mounted at ``/`` of the HTTP API (which hands it every request first): it reads the
  backend's loom through the backend and forks where the backend forks. Live:
  the page streams a session's events from ``GET /sessions/{id}/events``,
  prompts with ``POST /sessions/{id}/prompt?stream=1``, cancels with
  ``POST /sessions/{id}/cancel`` and forks with ``POST /api/fork`` (the one
  write this module adds: a new session continuing from a turn, LOOM-4).

Routes (``GET`` unless said; errors are ``{"error": {"code", "message"}}``):
``/`` (the page), ``/ui/{asset}``, ``/api/loom``,
``/api/entities?q=&offset=&limit=``, ``/api/entities/{id}/tree?offset=&limit=&turn=``,
``/api/entities/{id}/timeline?offset=&limit=&from=&to=&width=&px=`` (a cast's waterfall),
``/api/turns/{id}``, ``/api/threads/{turn id}?offset=&limit=``, ``/api/evals?offset=&limit=``
(the eval runs recorded in the loom), ``/api/evals/{run}?status=&name=&offset=&limit=`` (a
run's cases), ``/api/evals/{a}/vs/{b}?changed=`` (two runs' cases paired),
``/api/compare?a=&b=&offset=&limit=`` (two threads side by side), ``/api/memory/namespaces``,
``/api/memory/items``, ``/api/memory/item`` (the loom's memory store: :mod:`._memory`),
``POST /api/fork``.

The assets are plain HTML, CSS and JavaScript in ``cantrip/protocols/viewer/assets/``
(no CDN, no build step). They are served with a content security policy that
allows only this origin's own scripts, and the page builds every element with
``textContent`` -- loom text is data, never markup. Every JSON answer goes through
:func:`~cantrip.protocols.asgi._responses.json_response`, which redacts whatever it sends (a
route cannot forget), and ``loom FILE view`` sits behind the same request guard as
``serve`` (:mod:`._guard`: Host, Origin, token, ``Referrer-Policy``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote

import trio

from cantrip._errors import CantripError
from cantrip._install import require_extra
from cantrip._redact import get_logger, redact
from cantrip.loom._loom import Loom
from cantrip.protocols.asgi._body import BodyError, read_json_body
from cantrip.protocols.asgi._responses import json_response
from cantrip.protocols.middleware._guard import Guard
from cantrip.protocols.sessions import SessionBackend, SessionError
from cantrip.protocols.viewer._api import LoomViews, ViewerError, page_args
from cantrip.protocols.viewer._memory import LoomMemory, MemoryOpener, memory_route

log = get_logger("cantrip.viewer")
T = TypeVar("T")

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "timeline.js": "text/javascript; charset=utf-8",
    "compare.js": "text/javascript; charset=utf-8",
    "evals.js": "text/javascript; charset=utf-8",
    "memory.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MAX_FORK_BODY = 64 * 1024


def asset(name: str) -> bytes:
    """A packaged asset's bytes (package data: works from a wheel as from a checkout)."""
    return (resources.files("cantrip.protocols.viewer") / "assets" / name).read_bytes()


class Viewer:
    """The viewer's routes over ``views``; with a session ``backend`` (``cantrip serve``,
    either mode), every read goes through the backend (:meth:`SessionBackend.read_loom`:
    a PostgreSQL loom's queries in worker threads) and the page's fork through
    :meth:`SessionBackend.fork`, where its ``capabilities.viewer_fork`` offers it.
    ``memory`` opens the memory store the memory pages show (None: no memory)."""

    def __init__(
        self,
        views: LoomViews,
        backend: SessionBackend | None = None,
        limiter: trio.CapacityLimiter | None = None,
        memory: MemoryOpener | None = None,
    ) -> None:
        self.views = views
        self.backend = backend
        self.limiter = limiter
        """Without a backend, with a limiter, reads run in worker threads behind it (a
        PostgreSQL loom's queries block, and must not hold the event loop)."""
        self.memory = memory
        self._assets: dict[str, bytes] = {}

    @classmethod
    def over(
        cls,
        backend: SessionBackend,
        source: str | None = None,
        memory: MemoryOpener | None = None,
    ) -> Viewer:
        """The viewer of ``cantrip serve``: the backend's loom, its sessions (which of
        them run); the page may prompt and fork where the backend forks; ``memory`` is
        the store the server's memory routes opened."""
        handed = _Handed()
        views = LoomViews(handed, live=backend.capabilities.viewer_fork, source=source)
        viewer = cls(views, backend, memory=memory)
        viewer._handed = handed
        return viewer

    _handed: _Handed | None = None

    async def _read(self, read: Callable[[], T]) -> T:
        """One read of the views, where the loom is read: through the backend, in a
        worker thread behind the limiter, or at once."""
        backend, handed = self.backend, self._handed
        if backend is not None and handed is not None:

            def at(loom: Loom) -> T:
                handed.loom = loom  # a backend has one loom: every read sees the same
                return read()

            return await backend.read_loom(at)
        if self.limiter is None:
            return read()
        return await trio.to_thread.run_sync(read, limiter=self.limiter)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is the viewer's; ``False`` leaves it to the caller."""
        path: str = scope["path"]
        method: str = scope["method"]
        if path in ("/", "/index.html"):
            await self._asset(send, method, "index.html")
            return True
        if path.startswith("/ui/"):
            await self._asset(send, method, path.removeprefix("/ui/"))
            return True
        if path != "/api" and not path.startswith("/api/"):
            return False
        try:
            data = await self._api(scope, receive, method, path)
        except ViewerError as exc:
            await send_json(send, exc.status, error_body(exc.code, exc.message))
        else:
            await send_json(send, 201 if method == "POST" else 200, data)
        return True

    async def _asset(self, send: Send, method: str, name: str) -> None:
        if method not in ("GET", "HEAD"):
            await send_json(send, 405, error_body("method_not_allowed", "use GET"))
            return
        if name not in ASSETS:
            await send_json(send, 404, error_body("not_found", f"no asset {name!r}"))
            return
        body = self._assets.get(name)
        if body is None:
            body = self._assets[name] = asset(name)
        headers = [
            (b"content-type", ASSETS[name].encode()),
            (b"content-length", str(len(body)).encode()),
            (b"content-security-policy", CSP),
            (b"x-content-type-options", b"nosniff"),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

    async def _api(self, scope: Scope, receive: Receive, method: str, path: str) -> Any:
        parts = [unquote(p) for p in path.split("/") if p][1:]
        query = parse_qs(scope.get("query_string", b"").decode())
        views = self.views
        if parts == ["fork"]:
            _allow(method, "POST")
            return await self._fork(receive)
        _allow(method, "GET")
        if len(parts) == 2 and parts[0] == "memory":
            return await memory_route(
                parts[1],
                query,
                scope.get("query_string", b""),
                self.memory,
                self._read_loom,
                page_args(query),
            )
        read: Callable[[], Any]
        if parts == ["loom"]:
            read = views.overview
        elif parts == ["entities"]:
            await self._running()
            read = functools.partial(views.entities, query)
        elif parts and parts[0] == "evals":
            read = _evals_route(views, parts[1:], query, path)
        elif parts == ["compare"]:
            read = functools.partial(views.compare, query)
        elif len(parts) == 3 and parts[0] == "entities" and parts[2] == "tree":
            read = functools.partial(views.tree, parts[1], query)
        elif len(parts) == 3 and parts[0] == "entities" and parts[2] == "timeline":
            read = functools.partial(views.timeline, parts[1], query)
        elif len(parts) == 2 and parts[0] == "turns":
            read = functools.partial(views.turn, parts[1])
        elif len(parts) == 2 and parts[0] == "threads":
            read = functools.partial(views.thread, parts[1], query)
        else:
            raise ViewerError(404, "not_found", f"no route {path!r}")
        return await self._read(read)

    async def _read_loom(self, read: Callable[[Loom], T]) -> T:
        """``read`` of the loom, where the viewer reads its loom (:meth:`_read`)."""
        return await self._read(lambda: read(self.views.loom))

    async def _running(self) -> None:
        """Which entities run a prompt now (the entity list marks them), as the
        backend's sessions say."""
        if self.backend is not None:
            running = {s.entity_id for s in await self.backend.sessions() if s.running}
            self.views.running = running.__contains__

    async def _fork(self, receive: Receive) -> dict[str, Any]:
        """A new session continuing from a turn (LOOM-4); the page then prompts it."""
        if self.backend is None:
            raise ViewerError(
                405, "read_only", "this viewer is read-only; fork with `cantrip serve`"
            )
        capabilities = self.backend.capabilities
        if not capabilities.viewer_fork:  # the one place a mode says it does not fork
            raise ViewerError(
                501,
                "unsupported",
                f"this server's {capabilities.mode!r} sessions do not fork "
                "(capabilities.viewer_fork is false); fork with `cantrip serve` in process",
            )
        body = await read_json(receive, MAX_FORK_BODY)
        turn_id = body.get("turn_id") if isinstance(body, dict) else None
        if not isinstance(turn_id, str) or not turn_id:
            raise ViewerError(400, "bad_request", 'the body must be {"turn_id": "turn-..."}')
        await self._read(functools.partial(self.views.turn, turn_id))  # 404 before a fork
        try:
            session = await self.backend.fork(turn_id)
        except SessionError as exc:
            if exc.kind == "not_found":
                raise ViewerError(404, "unknown_turn", exc.message) from None
            raise ViewerError(409, "cannot_fork", redact(exc.message)) from None
        return {
            "session_id": session.session_id,
            "entity_id": session.entity_id,
            "forked_from": turn_id,
        }


class _Handed:
    """The loom :meth:`SessionBackend.read_loom` handed the read in progress: the
    source :class:`LoomViews` reads when the viewer is over a backend."""

    loom: Loom | None = None

    def __call__(self) -> Loom:
        if self.loom is None:
            raise RuntimeError("the viewer's views are read through read_loom only")
        return self.loom


def _evals_route(
    views: LoomViews, rest: list[str], query: Mapping[str, Any], path: str
) -> Callable[[], Any]:
    """``/api/evals``, ``/api/evals/{run}``, ``/api/evals/{a}/vs/{b}`` (:mod:`._evals`)."""
    if not rest:
        return functools.partial(views.evals, query)
    if len(rest) == 1:
        return functools.partial(views.eval_run, rest[0], query)
    if len(rest) == 3 and rest[1] == "vs":
        return functools.partial(views.eval_pairs, rest[0], rest[2], query)
    raise ViewerError(404, "not_found", f"no route {path!r}")


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise ViewerError(405, "method_not_allowed", f"use {' or '.join(allowed)}")


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


async def read_json(receive: Receive, limit: int) -> Any:
    try:
        return await read_json_body(receive, limit)
    except BodyError as exc:
        raise ViewerError(exc.status, exc.code, exc.message) from None


async def send_json(send: Send, status: int, data: Any) -> None:
    """Every viewer answer: redacted (by :func:`json_response`), never cached."""
    await json_response(send, status, data, {"cache-control": "no-store"})


# -- the read-only server of `cantrip loom FILE view` -----------------------------------


class LoomFile:
    """A loom file, reopened when it has changed on disk since it was last read
    (another process -- a running cast -- may be appending to it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self._loom = Loom.open(path)

    def _stat(self) -> tuple[int, int]:
        stat = self.path.stat()
        return stat.st_size, stat.st_mtime_ns

    def __call__(self) -> Loom:
        stamp = self._stat()
        if stamp != self._stamp:
            try:
                fresh = Loom.open(self.path)
            except CantripError as exc:  # e.g. a line still being written: keep the last
                log.warning("cannot reread %s: %s", self.path, exc)
                return self._loom
            self._loom.close()
            self._loom, self._stamp = fresh, stamp
        return self._loom

    def close(self) -> None:
        self._loom.close()


class ViewerApp:
    """The ASGI application of ``cantrip loom FILE view``: the viewer, read-only.

    Served behind :class:`~cantrip.protocols.middleware._guard.Guard` (:func:`serve_viewer`): with
    a token, the page (``/?token=TOKEN``) and every ``/api/`` request
    (``Authorization: Bearer TOKEN``, which the page sends) need it; the scripts and
    styles under ``/ui/`` hold no loom data and are served to anyone."""

    def __init__(
        self,
        source: Callable[[], Loom],
        name: str | None = None,
        *,
        limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        self.memory = LoomMemory(source)
        self.viewer = Viewer(LoomViews(source, source=name), limiter=limiter, memory=self.memory)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        if not await self.viewer.dispatch(scope, receive, send):
            await send_json(send, 404, error_body("not_found", f"no route {scope['path']!r}"))


def viewer_guard(host: str, token: str | None) -> Guard:
    """The guard of ``loom FILE view``: the token given, or ``CANTRIP_TOKEN``; binding
    beyond loopback without one is refused (:class:`~cantrip.protocols.middleware._guard.BindError`:
    a loom is private data)."""
    guard = Guard(
        bind_host=host,
        token=token or os.environ.get("CANTRIP_TOKEN") or None,
        server="cantrip loom view",
    )
    guard.check_bind()
    return guard


class LoomDatabase:
    """A PostgreSQL loom for the viewer: every read is a query, so it is always fresh."""

    def __init__(self, url: str) -> None:
        self._loom = Loom.open(url, create=False)  # reading never makes a loom
        store: Any = self._loom.store
        self.limiter: trio.CapacityLimiter = store.limiter
        self.name = str(store)  # the URL without its password

    def __call__(self) -> Loom:
        return self._loom

    def close(self) -> None:
        self._loom.close()


async def serve_viewer(
    path: Path | str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    guard: Guard | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the read-only viewer of the loom at ``path`` (a file, or a ``postgresql://``
    URL) with hypercorn's trio worker, behind ``guard`` (default: :func:`viewer_guard`
    without a token), until ``shutdown_trigger`` returns; ``task_status`` gets the URLs."""
    require_extra("serve", "the loom viewer")
    guard = guard if guard is not None else viewer_guard(host, None)
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    source: LoomFile | LoomDatabase
    if isinstance(path, str):
        source = LoomDatabase(path)
        app = ViewerApp(source, source.name, limiter=source.limiter)
    else:
        source = LoomFile(path)
        app = ViewerApp(source, path.name)
    try:
        await serve(
            guard.wrap(app),  # type: ignore[arg-type]
            config,
            shutdown_trigger=shutdown_trigger,
            task_status=task_status,
            mode="asgi",
        )
    finally:
        app.memory.close()
        source.close()
