"""Serving the one HTTP application: ``cantrip serve`` (:func:`serve_http`, entities
in this process) and ``cantrip serve --db`` (:func:`serve_http_db`, a replica over
PostgreSQL). Each builds its backend, the mounts beside the API and
:class:`~cantrip.protocols.http._app.HttpApp`, behind the request guard, and serves
them with hypercorn's trio worker (:func:`serve_asgi`) until told to stop; then the app
drains before hypercorn stops listening.

The mounts are today's entry points of the browser viewer, A2A and AG-UI, chosen here
because the caller knows its mode (issue 41 moves each onto the seam: then each is
built from the backend alone).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from cantrip._cantrip import Cantrip
from cantrip.loom._loom import Loom
from cantrip.protocols.a2a import _server as _a2a
from cantrip.protocols.a2a._push import Pushes
from cantrip.protocols.asgi._responses import Receive, Send
from cantrip.protocols.http._app import HttpApp, Mount
from cantrip.protocols.http._mounts import ReplicaView
from cantrip.protocols.middleware._arriving import arrivals
from cantrip.protocols.middleware._guard import Guard
from cantrip.protocols.middleware._lifecycle import ServeOptions
from cantrip.protocols.middleware._limits import SessionLimits
from cantrip.protocols.sessions import PostgresBackend, ProcessBackend


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
    ``backend.running()``) and A2A's push deliveries (``pushes.run``)."""

    app: HttpApp
    backend: ProcessBackend
    pushes: Pushes


def process_server(
    spell: Cantrip,
    options: ServeOptions | None = None,
    limits: SessionLimits | None = None,
) -> ProcessServer:
    """The app of ``cantrip serve`` over the in-process backend, with the browser
    viewer, A2A when the SDK is installed, and AG-UI."""
    from cantrip.protocols.a2a._tasks import SessionTasks
    from cantrip.protocols.agui._hub import serve_agui
    from cantrip.protocols.viewer._app import Viewer

    options = options or ServeOptions()
    limits = limits or SessionLimits()
    backend = ProcessBackend.serving(spell, sticky_cancel_s=options.sticky_cancel_s, limits=limits)
    hub = backend.hub
    mounts: list[Mount] = [Viewer.for_hub(hub).dispatch]  # the browser viewer at / and /api/
    pushes = Pushes(allow_private=options.a2a_push_private)
    if _a2a.available():  # A2A (Agent Card + JSON-RPC) with the a2a-sdk extra
        mounts.append(_a2a.A2AFront(spell, SessionTasks(hub, limits, pushes=pushes)).dispatch)

    async def agui(receive: Receive, send: Send) -> None:
        await serve_agui(hub, receive, send, lambda: backend.make_room(adding=True))

    app = HttpApp(backend, spell, options, mounts=mounts, agui=agui)
    return ProcessServer(app, backend, pushes)


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
    await trio.to_thread.run_sync(_a2a.available)  # the SDK's import, off the loop
    server = process_server(spell, options, limits)
    app, backend = server.app, server.backend
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()
    async with backend.running(), trio.open_nursery() as background:
        # A2A push notifications are delivered as long as we serve
        background.start_soon(server.pushes.run)
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
    from cantrip.protocols.a2a._db import a2a_front
    from cantrip.protocols.agui._db import serve_db_agui
    from cantrip.protocols.viewer._api import LoomViews
    from cantrip.protocols.viewer._app import Viewer

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
        replica = ReplicaView(backend, app)  # what today's --db AG-UI and A2A ask of it
        mounts = app.mounts
        if await trio.to_thread.run_sync(_a2a.available):  # the SDK's import, off the loop
            mounts.append((await trio.to_thread.run_sync(a2a_front, replica)).dispatch)
        store = backend.db.store
        loom = Loom(store, journal=True)  # reads are queries: always fresh
        views = LoomViews(lambda: loom, source=str(store))
        mounts.append(Viewer(views, limiter=store.limiter).dispatch)  # read-only viewer

        async def agui(receive: Receive, send: Send) -> None:
            await serve_db_agui(replica, receive, send)

        app.agui = agui
        await serve_asgi(
            app,
            _a2a.jsonrpc_refusals(guard.wrap(app)),
            host,
            port,
            shutdown_trigger=shutdown_trigger,
            read_timeout_s=read_timeout_s,
            task_status=task_status,
        )
