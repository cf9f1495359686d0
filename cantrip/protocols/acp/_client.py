"""The agent's own JSON-RPC requests to the ACP client (a permission asked, an
elicitation) and the client's answers to them, matched by id.

Apart from :mod:`._server` because it is a job of its own -- the reverse direction of
the connection, with its own bookkeeping (the requests waiting, their ids, withdrawing
one with ``$/cancel_request`` when the asker is cancelled) -- that nothing in the
server's methods needs to see."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from cantrip._redact import get_logger
from cantrip.protocols.acp._rpc import INTERNAL, RpcError

log = get_logger("cantrip.acp")

Notify = Callable[[dict[str, Any]], Awaitable[None]]


@attrs.define(eq=False)
class _Reply:
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: Mapping[str, Any] | None = None


class ClientRequests:
    """Requests this agent sent the client, by id, until the client answers."""

    def __init__(self, notify: Notify | None) -> None:
        self._notify = notify
        self._requests = itertools.count(1)
        self._waiting: dict[str, _Reply] = {}
        """Requests this agent sent the client, by id."""

    async def request(self, method: str, params: Mapping[str, Any]) -> Any:
        """Send the client a JSON-RPC request and wait for its result; cancelled, the
        request is withdrawn with ``$/cancel_request``."""
        if self._notify is None:
            raise RpcError(INTERNAL, f"no client to send {method} to")
        request_id = f"cantrip-{next(self._requests)}"
        reply = self._waiting[request_id] = _Reply()
        try:
            await self._notify(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}
            )
            await reply.done.wait()
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await self._notify(
                    {
                        "jsonrpc": "2.0",
                        "method": "$/cancel_request",
                        "params": {"requestId": request_id},
                    }
                )
            raise
        finally:
            self._waiting.pop(request_id, None)
        if reply.error is not None:
            raise RpcError(int(reply.error.get("code", INTERNAL)), str(reply.error.get("message")))
        return reply.result

    def deliver(self, message: Mapping[str, Any]) -> None:
        reply = self._waiting.get(str(message.get("id")))
        if reply is None:
            log.info("a response to no request of ours: %r", message.get("id"))
            return
        error = message.get("error")
        reply.error = error if isinstance(error, Mapping) else None
        reply.result = message.get("result")
        reply.done.set()
