"""``cantrip mcp SPEC.toml [--http [--host H] [--port P] [--token T]]``: the CLI side.

The command's options, and serving until the client leaves (stdio) or SIGINT/SIGTERM
(``--http``); the server itself is :mod:`cantrip.protocols.mcp_server._server`."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from cantrip._cantrip import Cantrip
from cantrip._errors import CantripError
from cantrip._install import require_extra
from cantrip.cli._process import debug_log


def run_mcp(
    args: argparse.Namespace,
    load: Callable[[Path], Cantrip],
    fail: Callable[[str], int],
) -> int:
    require_extra("mcp", "cantrip mcp")
    debug_log(args.log)
    try:
        spell = load(args.spec)
    except CantripError as exc:
        return fail(str(exc))
    try:
        if args.check:
            print(f"ok: {args.spec} loads; tool: cast", file=sys.stderr)
            return 0
        if not args.http:
            from cantrip.protocols.mcp_server._server import serve_stdio

            with contextlib.suppress(KeyboardInterrupt):
                trio.run(functools.partial(serve_stdio, spell, input_ttl_s=args.input_ttl))
            return 0
        return _serve_http(args, spell, fail)
    finally:
        spell.loom.close()


def _serve_http(args: argparse.Namespace, spell: Cantrip, fail: Callable[[str], int]) -> int:
    from cantrip.protocols.mcp_server._server import http_guard, serve_http
    from cantrip.protocols.middleware._guard import BindError

    token = args.token or os.environ.get("CANTRIP_MCP_TOKEN") or None
    try:
        http_guard(args.host, token)  # a public bind without a token is refused up front
    except BindError as exc:
        return fail(str(exc))

    from cantrip.cli._serve import serve_until_signal

    failure = serve_until_signal(
        functools.partial(
            serve_http, spell, args.host, args.port, token=token, input_ttl_s=args.input_ttl
        ),
        host=args.host,
        port=args.port,
        spec=args.spec,
        draining=None,
        announce=lambda bind: f"cantrip: MCP (streamable HTTP) for {args.spec} at {bind}/mcp",
    )
    return fail(failure) if failure is not None else 0
