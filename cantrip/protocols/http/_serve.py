"""Serving the one HTTP application: ``cantrip serve`` (:func:`serve_http`, entities
in this process) and ``cantrip serve --db`` (:func:`serve_http_db`, a replica over
PostgreSQL). Each builds its backend, the mounts beside the API and
:class:`~cantrip.protocols.http._app.HttpApp`, behind the request guard, and serves
them with hypercorn's trio worker (:func:`serve_asgi`) until told to stop; then the app
drains before hypercorn stops listening.

Beside the API the same three protocols are mounted in both modes, each built from the
backend alone (:func:`mount_protocols`): the browser viewer, A2A (with the SDK) and
AG-UI; what a mode lacks (A2A push, the viewer's fork) its backend's capabilities say.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from cantrip._cantrip import Cantrip
from cantrip._install import require_extra
from cantrip.protocols.a2a import _server as _a2a
from cantrip.protocols.a2a._push import Pushes
from cantrip.protocols.asgi._responses import Receive, Scope, Send
from cantrip.protocols.http._app import HttpApp
from cantrip.protocols.http._memory import MemoryRoutes
from cantrip.protocols.middleware._arriving import arrivals
from cantrip.protocols.middleware._guard import Guard
from cantrip.protocols.middleware._lifecycle import ServeOptions
from cantrip.protocols.sessions import PostgresBackend, ProcessBackend, SessionBackend, SessionError
from cantrip.protocols.sessions._limits import SessionLimits

if TYPE_CHECKING:
    from cantrip.protocols.a2a._handler import A2AFront


async def serve_asgi(
    app: HttpApp,
    asgi: Any,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    read_timeout_s: int,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """Serve ``asgi`` (``app`` behind its guard) with hypercorn's trio worker until
    ``shutdown_trigger`` returns and ``app`` has drained (or the task is cancelled);
    ``task_status`` gets the bound URLs. Only idle connections are left when the
    drain ends, so hypercorn's own grace is short."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from cantrip.protocols.middleware._hypercorn import install

    install()  # a client that hangs up frees its connection now, not after keep-alive

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = app.options.keep_alive_s
    config.backlog = app.options.backlog
    config.graceful_timeout = 5.0  # only idle connections are left by then
    config.read_timeout = read_timeout_s

    async def drained() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        await app.shutdown()

    await serve(asgi, config, shutdown_trigger=drained, task_status=task_status, mode="asgi")


@attrs.frozen
class ProcessServer:
    """What ``cantrip serve`` serves: the app, its in-process backend (run it with
    ``backend.running()``) and A2A (``a2a.run`` delivers its push notifications)."""

    app: HttpApp
    backend: ProcessBackend
    a2a: A2AFront | None


def load_protocols() -> bool:
    """Import what :func:`mount_protocols` mounts -- AG-UI's models, the viewer, the
    A2A front and its SDK where installed -- and say whether A2A is available. Called
    off the loop (``trio.to_thread``) before the first mount: a module's first import
    runs on whatever thread asks, and AG-UI's generated models alone hold it 0.3-0.8 s
    on a busy machine -- on the loop thread, a stall of every task a server runs."""
    import cantrip.protocols.a2a._handler
    import cantrip.protocols.agui._run
    import cantrip.protocols.viewer._app  # noqa: F401

    return _a2a.available()


def process_server(
    spell: Cantrip,
    options: ServeOptions | None = None,
    limits: SessionLimits | None = None,
) -> ProcessServer:
    """The app of ``cantrip serve`` over the in-process backend, with the browser
    viewer, A2A when the SDK is installed, and AG-UI."""
    options = options or ServeOptions()
    limits = limits or SessionLimits()
    backend = ProcessBackend.serving(spell, sticky_cancel_s=options.sticky_cancel_s, limits=limits)
    app = HttpApp(backend, spell, options)
    pushes = Pushes(allow_private=options.a2a_push_private)
    a2a = mount_protocols(app, backend, spell, pushes=pushes, a2a=_a2a.available())
    return ProcessServer(app, backend, a2a)


def process_app(
    spell: Cantrip,
    options: ServeOptions | None = None,
    limits: SessionLimits | None = None,
) -> HttpApp:
    """:func:`process_server`'s app."""
    return process_server(spell, options, limits).app


async def serve_http(
    spell: Cantrip,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    options: ServeOptions | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    guard: Guard | None = None,
    limits: SessionLimits | None = None,
    read_timeout_s: int = 30,
) -> None:
    """Serve the HTTP API of ``cantrip serve`` until ``shutdown_trigger`` returns (or
    the task is cancelled); ``task_status`` gets the bound URLs.

    ``guard`` is the request policy (default: loopback names only, no token); it
    refuses to start on a non-loopback address without a token
    (:class:`~cantrip.protocols.middleware._guard.BindError`). ``read_timeout_s`` bounds
    each socket read, so a client that stops sending is dropped."""
    await trio.to_thread.run_sync(require_extra, "serve", "cantrip serve")  # disk lookups
    await trio.to_thread.run_sync(load_protocols)  # their first imports, off the loop
    server = process_server(spell, options, limits)
    app, backend = server.app, server.backend
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()
    async with backend.running(), trio.open_nursery() as background:
        if server.a2a is not None:  # A2A push notifications, as long as we serve
            await background.start(server.a2a.run)
        await serve_asgi(
            app,
            _a2a.jsonrpc_refusals(arrivals(guard.wrap(app), backend.announce)),
            host,
            port,
            shutdown_trigger=shutdown_trigger,
            read_timeout_s=read_timeout_s,
            task_status=task_status,
        )
        background.cancel_scope.cancel()


async def serve_http_db(
    spell: Mapping[str, Any],
    cantrip: Cantrip,
    url: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    options: ServeOptions | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    guard: Guard | None = None,
    read_timeout_s: int = 30,
    max_connections: int = 8,
) -> None:
    """Serve the HTTP API of ``cantrip serve --db`` until ``shutdown_trigger`` returns
    (or the task is cancelled); ``task_status`` gets the bound URLs. The replica runs
    no entity: sessions live in PostgreSQL, a prompt is work a ``cantrip worker``
    runs, every read is a query (:class:`~cantrip.protocols.sessions.PostgresBackend`)."""
    await trio.to_thread.run_sync(require_extra, "serve", "cantrip serve")  # disk lookups
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()
    options = options or ServeOptions()
    async with PostgresBackend.open(
        url,
        spell,
        sticky_cancel_s=options.sticky_cancel_s,
        max_connections=max_connections,
        humans=cantrip.circle.needs_humans,
    ) as backend:
        app = HttpApp(backend, cantrip, options, title="cantrip serve --db")
        available = await trio.to_thread.run_sync(load_protocols)  # off the loop
        mount_protocols(app, backend, cantrip, source=str(backend.db.store), a2a=available)
        await serve_asgi(
            app,
            _a2a.jsonrpc_refusals(guard.wrap(app)),
            host,
            port,
            shutdown_trigger=shutdown_trigger,
            read_timeout_s=read_timeout_s,
            task_status=task_status,
        )


def mount_protocols(
    app: HttpApp,
    backend: SessionBackend,
    cantrip: Cantrip,
    *,
    source: str | None = None,
    pushes: Pushes | None = None,
    a2a: bool = True,
) -> A2AFront | None:
    """Mount the protocols beside the API, over ``app``'s backend, the same in both
    modes: the browser viewer at ``/`` and ``/api/`` (``source`` names its loom), A2A
    (Agent Card + JSON-RPC; push where ``backend.capabilities.a2a_push``) when ``a2a``,
    and AG-UI at ``POST /agui``. A prompt either takes is refused where the API's is
    (:class:`~cantrip.protocols.middleware._lifecycle.Admission`). Returns the A2A
    front, whose ``run`` delivers push notifications (None without A2A)."""
    from cantrip.protocols.a2a._handler import A2AFront
    from cantrip.protocols.agui._run import serve_agui
    from cantrip.protocols.viewer._app import Viewer

    memory = MemoryRoutes(backend, cantrip)
    app.mounts.append(Viewer.over(backend, source, memory=memory.opened).dispatch)
    app.mounts.append(memory.dispatch)  # /memory/...
    front = None
    if a2a:

        async def admit(session_id: str | None) -> None:
            app.admission.check()

        front = A2AFront(
            cantrip,
            backend,
            pushes=pushes if backend.capabilities.a2a_push else None,
            admit=admit,
        )
        app.mounts.append(front.dispatch)

    @contextlib.asynccontextmanager
    async def admitted() -> AsyncIterator[None]:
        try:
            app.admission.check()
        except SessionError as exc:
            raise app.refusal(exc) from None
        with app.admission.holding():
            yield

    async def agui(scope: Scope, receive: Receive, send: Send) -> None:
        await serve_agui(
            backend,
            receive,
            send,
            gate_names=cantrip.circle.gate_names,
            admitted=admitted,
            drain=app.drain,
            scope=scope,
        )

    app.agui = agui
    return front
