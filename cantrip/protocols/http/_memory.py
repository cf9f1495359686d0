"""The memory routes of ``cantrip serve`` (both modes): a mount beside the session API.

* ``GET    /memory/namespaces?prefix=&limit=`` -- the namespaces holding items;
* ``GET    /memory/items?namespace=&q=&mode=&limit=&offset=`` -- items under a
  namespace, best match first with ``q`` (text, semantic or hybrid), newest first without;
* ``GET    /memory/item?namespace=&key=`` -- one item, its revisions and the turn
  that wrote it;
* ``DELETE /memory/items?namespace=&key=&dry_run=1`` -- forget one item or every item
  under a (non-empty) namespace; ``dry_run`` only says which.

A namespace is typed as in ``cantrip memory`` (``user/alice``, or a JSON list). The
answers are :mod:`cantrip.memory._browse`'s, so the CLI and HTTP say the same; the
store is the one beside the served loom, opened once with the spec's embedder, and
called in worker threads. The mount sits inside the app, so the request guard (host,
origin, bearer token) covers it like every route. A cantrip without ``[memory]`` has
no memory to show: every route is 404 ``no_memory``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs

import trio

from cantrip._cantrip import Cantrip
from cantrip.loom._loom import Loom
from cantrip.memory import _browse as browse
from cantrip.memory._model import MemoryStoreError
from cantrip.memory._open import memory_for
from cantrip.memory._store import MemoryBackend
from cantrip.protocols.asgi._requests import allow, truthy
from cantrip.protocols.asgi._responses import HttpError, Receive, Scope, Send, json_response
from cantrip.protocols.sessions import SessionBackend

PREFIX = "/memory/"
ROUTES = {"namespaces", "items", "item"}
MAX_QUERY_STRING = browse.MAX_QUERY_STRING
T = TypeVar("T")


class MemoryRoutes:
    """``/memory/...`` over the memory beside ``backend``'s loom (see the module doc)."""

    def __init__(self, backend: SessionBackend, cantrip: Cantrip) -> None:
        self.backend = backend
        self.cantrip = cantrip
        self._store: MemoryBackend | None = None
        self._opening = trio.Lock()

    async def store(self) -> MemoryBackend:
        """The store, opened once (in a worker thread: opening migrates its tables)."""
        async with self._opening:
            if self._store is None:
                settings = self.cantrip.memory
                assert settings is not None
                if settings.store is not None:
                    self._store = settings.store
                else:
                    loom_store = await self.backend.read_loom(lambda loom: loom.store)
                    self._store = await trio.to_thread.run_sync(
                        functools.partial(memory_for, loom_store, embedder=settings.embedder)
                    )
            return self._store

    async def opened(self) -> MemoryBackend | None:
        """The store, or None when the cantrip has no memory: what the viewer's memory
        pages show (:mod:`cantrip.protocols.viewer._memory`), one store for both."""
        return None if self.cantrip.memory is None else await self.store()

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> bool:
        path = scope["path"]
        if not path.startswith(PREFIX) or path[len(PREFIX) :] not in ROUTES:
            return False
        if self.cantrip.memory is None:
            raise HttpError(404, "no_memory", "this cantrip has no memory (no [memory] table)")
        raw = scope.get("query_string", b"")
        if len(raw) > MAX_QUERY_STRING:
            raise HttpError(
                414,
                "bad_request",
                f"a memory route reads at most {MAX_QUERY_STRING} bytes of query",
            )
        try:
            query = parse_qs(raw.decode(), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise HttpError(400, "bad_request", "the query string is not UTF-8") from None
        try:
            body = await self._answer(path[len(PREFIX) :], scope["method"], query)
        except MemoryStoreError as exc:
            raise HttpError(400, "bad_request", str(exc)) from None
        await json_response(send, 200, body)
        return True

    async def _answer(self, route: str, method: str, query: dict[str, list[str]]) -> Any:
        store = await self.store()
        if route == "namespaces":
            allow(method, "GET")
            prefix = browse.parse_namespace(_one(query, "prefix", ""))
            limit = _int(query, "limit", 100)
            found = await _run(store, browse.namespaces, store, prefix, limit=limit)
            return {"namespaces": found}
        if route == "item":
            allow(method, "GET")
            namespace = browse.parse_namespace(_one(query, "namespace", ""), prefix=False)
            key = _one(query, "key", "")
            try:
                shown = await _run(store, browse.show, store, None, namespace, key)
            except KeyError as exc:
                raise HttpError(404, "not_found", str(exc.args[0])) from None
            source = shown.get("source")
            turn_id = source.get("turn_id") if isinstance(source, dict) else None
            if isinstance(turn_id, str):
                shown["source_turn"] = await self.backend.read_loom(
                    functools.partial(_turn_of, turn_id=turn_id)
                )
            return shown
        allow(method, "GET", "DELETE")
        if method == "DELETE":
            namespace = browse.parse_namespace(_one(query, "namespace", ""))
            one: str | None = query.get("key", [None])[-1]
            dry_run = truthy(query.get("dry_run"))
            gone = await _run(store, browse.forget, store, namespace, one, dry_run=dry_run)
            return {"dry_run": dry_run, "forgotten": gone}
        prefix = browse.parse_namespace(_one(query, "namespace", ""))
        mode = query.get("mode", [None])[-1]
        if mode in ("semantic", "hybrid") and getattr(store, "embedder", None) is None:
            # valid as asked, refused by this server's state: 409, like a busy session
            raise HttpError(
                409,
                "no_embedder",
                f"a {mode} search needs an embedder: name one in the "
                "spec's [memory] table (embedder = {provider = ...})",
            )
        items = await _run(
            store,
            browse.items,
            store,
            prefix,
            query=query.get("q", [None])[-1],
            mode=mode,
            limit=_int(query, "limit", 20),
            offset=_int(query, "offset", 0),
        )
        return {"items": items}


def _turn_of(loom: Loom, turn_id: str) -> dict[str, Any] | None:
    return browse.turn_summary(loom, turn_id)


async def _run(store: MemoryBackend, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(
        functools.partial(call, *args, **kwargs), limiter=store.limiter
    )


def _one(query: dict[str, list[str]], name: str, default: str) -> str:
    values = query.get(name)
    return values[-1] if values else default


def _int(query: dict[str, list[str]], name: str, default: int) -> int:
    text = _one(query, name, str(default))
    if not text.isdigit() or len(text) > 9:
        raise HttpError(400, "bad_request", f"{name} is a whole number; got {text[:40]!r}")
    return int(text)
