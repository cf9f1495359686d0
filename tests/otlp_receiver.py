"""A loopback OTLP/HTTP receiver for tests: it keeps the raw protobuf bytes of every
export request (``POST /v1/traces``) and answers 200, as a collector would."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Received:
    """What the receiver got: each request's body, as sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    @property
    def raw(self) -> bytes:
        return b"".join(self.bodies)

    def spans(self) -> list[object]:
        found: list[object] = []
        for body in self.bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    found.extend(scope.spans)
        return found


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, Received]]:
    """Yield the receiver's ``/v1/traces`` URL and what it has received so far."""
    received = Received()

    async def receive(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += await stream.receive_some(65536)
        received.bodies.append(body)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n"
            b"content-length: 0\r\nconnection: close\r\n\r\n"
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, receive, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/v1/traces", received
        finally:
            nursery.cancel_scope.cancel()
