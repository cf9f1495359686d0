"""A2A push notifications: the server POSTs a task's updates to a webhook its client named.

A client that cannot hold a stream open gives a ``TaskPushNotificationConfig`` (with
its message, or with ``CreateTaskPushNotificationConfig``): a URL, and a ``token``
and/or ``authentication`` the server sends back so the webhook knows the call is ours.
Each update of the task (status, artifact) is then POSTed there as a
``StreamResponse`` JSON body, with ``X-A2A-Notification-Token: <token>`` and
``Authorization: <scheme> <credentials>`` -- the headers the SDK's own sender uses.

The URL comes from whoever may call the server, so it is untrusted (server-side request
forgery): only ``http``/``https``; its host must resolve to public addresses only --
loopback, private, link-local, site-local, shared, reserved, documentation, multicast
and unspecified ones, and IPv6 forms of those IPv4 ones (6to4, NAT64, ...), are refused
(:mod:`cantrip.protocols.middleware._public_ip`) unless the operator allows them
(``allow_private``: a webhook on the same machine or network). The check is made when
the config is given (a refusal is the protocol's ``InvalidParams``) and again at every
connection, on the address that is then connected to (:class:`_CheckedBackend`), so a
name that resolves elsewhere later (DNS rebinding) reaches nothing it should not;
redirects are not followed. Each attempt is bounded in time (``timeout_s``). A delivery
that fails for a reason that may pass -- no connection, a timeout, ``408``, ``429`` or a
``5xx`` -- is tried again after ``retry_delays`` (1 s, then 4 s; a ``Retry-After`` of at
most 30 s is waited instead), in place, so the task's later updates still arrive after
it; any other answer (``4xx``: the webhook refuses it) is final. A notification that
failed every attempt is lost (logged with the URL's scheme, host and port only: never
the token, the credentials or the rest of the URL), and its config *rests* for
``rest_s`` (60 s): its notifications meanwhile are dropped at once, so a dead webhook
holds up its lane -- the other tasks that share it -- for one round of attempts a
minute, not one per notification.

Deliveries keep each task's order: a task's notifications go through one of
``lanes`` queues (by task id), each drained by one task in the server's nursery.
"""

from __future__ import annotations

import json
import math
import uuid
import zlib
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import httpcore
import trio

from cantrip._redact import get_logger
from cantrip.protocols.middleware._public_ip import is_public

log = get_logger("cantrip.a2a")

TIMEOUT_S = 10.0
"""One delivery (resolve, connect, send, answer), at most."""
MAX_CONFIGS = 10
"""Push configs per task."""
KEPT_TASKS = 1000
"""Tasks whose configs are kept (the oldest task's go first): the tasks themselves are
the session backend's, which forgets settled ones on its own."""
QUEUED = 1000
"""Notifications waiting per lane; beyond that new ones are dropped (logged)."""
LANES = 4
RETRY_DELAYS = (1.0, 4.0)
"""Seconds before the second and third attempt of a delivery that failed transiently."""
MAX_RETRY_AFTER_S = 30.0
"""A webhook's ``Retry-After`` longer than this ends the delivery instead."""
REST_S = 60.0
"""A config whose notification failed every attempt takes no new one for this long."""
_TRANSIENT_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))


class RefusedURL(ValueError):
    """A webhook URL the server will not call (the reason says why)."""


def where(url: str) -> str:
    """What a log line may say of a webhook URL: scheme, host and port (no credentials,
    path or query, which may carry secrets)."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname}:{parts.port or ''}"
    except ValueError:
        return "<unparseable url>"


def _blocked(address: str) -> bool:
    """Whether an address is not a public unicast destination (the explicit check of
    :mod:`cantrip.protocols.middleware._public_ip`, not ``is_global`` alone)."""
    return not is_public(address)


def parse_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a webhook URL, or :class:`RefusedURL`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise RefusedURL("the URL does not parse") from None
    if parts.scheme not in ("http", "https"):
        raise RefusedURL("only http and https URLs are called")
    if not parts.hostname:
        raise RefusedURL("the URL has no host")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


async def checked_addresses(host: str, port: int, allow_private: bool) -> list[str]:
    """The addresses ``host`` resolves to, if every one may be called (the resolver is
    trio's, in a thread; the caller bounds the time)."""
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    except OSError as exc:
        raise RefusedURL(f"the host does not resolve ({exc.strerror or exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise RefusedURL("the host does not resolve")
    if not allow_private:
        blocked = [a for a in addresses if _blocked(a)]
        if blocked:
            raise RefusedURL(
                f"the host resolves to a non-public address ({blocked[0]}); the server's "
                "operator can allow those (cantrip serve --a2a-push-private)"
            )
    return addresses


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to addresses checked at connect time."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, allow_private: bool) -> None:
        self.inner = inner
        self.allow_private = allow_private

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await checked_addresses(host, port, self.allow_private)
        except RefusedURL as exc:
            raise httpcore.ConnectError(str(exc)) from None
        return await self.inner.connect_tcp(
            addresses[0], port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks are not called over unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class Pushes:
    """The push configs of one server's tasks (in memory) and their delivery."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        timeout_s: float = TIMEOUT_S,
        lanes: int = LANES,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        rest_s: float = REST_S,
        kept_tasks: int = KEPT_TASKS,
    ) -> None:
        self.allow_private = allow_private
        self.timeout_s = timeout_s
        self.retry_delays = retry_delays
        self.rest_s = rest_s
        self.kept_tasks = kept_tasks
        self._resting: dict[tuple[str, str], float] = {}
        """Configs (task id, config id) whose last notification failed: until when."""
        self._configs: dict[str, dict[str, Any]] = {}
        self._lanes = [trio.open_memory_channel[tuple[Any, Any]](QUEUED) for _ in range(lanes)]
        self.delivered = 0
        self.failed = 0

    # -- configs (what the A2A methods do) ------------------------------------------------

    async def check(self, config: Any) -> Any:
        """A copy of ``config`` if its URL may be called (else the protocol's error)."""
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import InvalidParamsError

        try:
            _scheme, host, port = parse_url(config.url)
            with trio.fail_after(self.timeout_s):
                await checked_addresses(host, port, self.allow_private)
        except RefusedURL as exc:
            raise InvalidParamsError(message=f"push notification URL refused: {exc}") from None
        except trio.TooSlowError:
            raise InvalidParamsError(
                message="push notification URL refused: its host took too long to resolve"
            ) from None
        checked = pb.TaskPushNotificationConfig()
        checked.CopyFrom(config)
        return checked

    def keep(self, config: Any) -> Any:
        """Keep a checked config for its task (its id made if it has none)."""
        from a2a.utils.errors import InvalidParamsError

        config.id = config.id or uuid.uuid4().hex
        configs = self._configs.setdefault(config.task_id, {})
        if config.id not in configs and len(configs) >= MAX_CONFIGS:
            raise InvalidParamsError(message=f"a task takes at most {MAX_CONFIGS} push configs")
        configs[config.id] = config
        while len(self._configs) > self.kept_tasks:
            self.forget(next(iter(self._configs)))
        log.info("task %s: push notifications to %s", config.task_id, where(config.url))
        return config

    def get(self, task_id: str, config_id: str) -> Any:
        from a2a.utils.errors import TaskNotFoundError

        config = self._configs.get(task_id, {}).get(config_id)
        if config is None:
            raise TaskNotFoundError(message=f"task {task_id} has no push config {config_id!r}")
        return config

    def configs(self, task_id: str) -> list[Any]:
        return list(self._configs.get(task_id, {}).values())

    def delete(self, task_id: str, config_id: str) -> None:
        self._configs.get(task_id, {}).pop(config_id, None)

    def forget(self, task_id: str) -> None:
        for config_id in self._configs.pop(task_id, {}):
            self._resting.pop((task_id, config_id), None)

    # -- delivery -------------------------------------------------------------------------

    def notify(self, task_id: str, event: Any) -> None:
        """Queue ``event`` (a task, status or artifact update) for the task's webhooks."""
        configs = self._configs.get(task_id)
        if not configs:
            return
        lane = self._lanes[zlib.crc32(task_id.encode()) % len(self._lanes)][0]
        for config in configs.values():
            try:
                lane.send_nowait((config, event))
            except trio.WouldBlock:
                self.failed += 1
                log.warning("task %s: push notification to %s dropped (too many queued)",
                            task_id, where(config.url))  # fmt: skip
            except trio.ClosedResourceError:
                return

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled (the server's lifetime)."""
        backend = _CheckedBackend(httpcore.AnyIOBackend(), self.allow_private)
        async with (
            httpcore.AsyncConnectionPool(network_backend=backend, max_connections=16) as pool,
            trio.open_nursery() as nursery,
        ):
            for _send, receive in self._lanes:
                nursery.start_soon(self._drain, pool, receive)
            task_status.started()

    async def _drain(self, pool: Any, receive: trio.MemoryReceiveChannel[tuple[Any, Any]]) -> None:
        async for config, event in receive:
            await self._deliver(pool, config, event)

    async def _deliver(self, pool: Any, config: Any, event: Any) -> None:
        """One notification, tried again while its failures may pass (the boundary of
        an external server: a failure is logged and the notification lost; nothing
        secret is logged)."""
        from a2a.utils.proto_utils import to_stream_response
        from google.protobuf.json_format import MessageToDict

        rest = (config.task_id, config.id)
        if self._resting.get(rest, -math.inf) > trio.current_time():
            self.failed += 1
            log.debug("task %s: push notification to %s dropped (the webhook rests)",
                      config.task_id, where(config.url))  # fmt: skip
            return
        headers = [(b"content-type", b"application/json")]
        if config.token:
            headers.append((b"x-a2a-notification-token", config.token.encode()))
        auth = config.authentication
        if config.HasField("authentication") and auth.scheme and auth.credentials:
            headers.append((b"authorization", f"{auth.scheme} {auth.credentials}".encode()))
        body = json.dumps(MessageToDict(to_stream_response(event))).encode()
        attempts = 0
        while True:
            attempts += 1
            why, again, asked = await self._attempt(pool, config, headers, body)
            if why is None:
                self.delivered += 1
                self._resting.pop(rest, None)
                return
            if not again or attempts > len(self.retry_delays):
                break
            pause = self.retry_delays[attempts - 1] if asked is None else asked
            if pause > MAX_RETRY_AFTER_S:  # the webhook asked for longer than a lane waits
                break
            await trio.sleep(pause)
        self.failed += 1
        if again:
            self._resting[rest] = trio.current_time() + self.rest_s
        log.warning("task %s: push notification to %s failed (%d attempt%s): %s",
                    config.task_id, where(config.url), attempts, "s" * (attempts > 1),
                    why)  # fmt: skip

    async def _attempt(
        self, pool: Any, config: Any, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[str | None, bool, float | None]:
        """One POST: (why it failed, or None; whether trying again may help; the
        ``Retry-After`` it asked for, in seconds)."""
        status = None
        retry_after = None
        with trio.move_on_after(self.timeout_s):
            try:
                response = await pool.request(
                    "POST",
                    config.url,
                    headers=headers,
                    content=body,
                    extensions={
                        "timeout": dict.fromkeys(
                            ("connect", "read", "write", "pool"), self.timeout_s
                        )
                    },
                )
                status = response.status
                retry_after = _retry_after(response.headers)
            except (httpcore.TimeoutException, httpcore.NetworkError,
                    httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:  # fmt: skip
                return type(exc).__name__, not isinstance(exc, httpcore.UnsupportedProtocol), None
        if status is None:
            return "timed out", True, None
        if 200 <= status < 300:
            return None, False, None
        return f"HTTP {status}", status in _TRANSIENT_STATUSES, retry_after


def _retry_after(headers: Iterable[tuple[bytes, bytes]]) -> float | None:
    """A ``Retry-After`` given in seconds (a date is not honoured: our own delay then)."""
    for name, value in headers:
        if name.lower() == b"retry-after":
            text = value.decode("latin-1").strip()
            return float(text) if text.isdigit() else None
    return None
