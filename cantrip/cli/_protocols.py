"""``cantrip serve`` and ``cantrip acp``: a spec's cantrip served to clients.

``serve`` is the HTTP session API (and the viewer) in this process -- with ``--db``
a stateless replica over PostgreSQL instead (:func:`cantrip.cli._worker.serve_on_db`);
``acp`` is the Agent Client Protocol on stdio. Both can write a debug log to a file
(stdout may be the protocol).
"""

from __future__ import annotations

import argparse
import functools
import os

import trio

from cantrip._install import require_extra
from cantrip.cli._exit import fail
from cantrip.cli._process import debug_log
from cantrip.cli._spec_file import check_spec, load_cantrip


def run_acp(args: argparse.Namespace) -> int:
    from cantrip.protocols import serve_stdio

    debug_log(args.log)
    if args.db:
        from cantrip.cli._worker import acp_on_db

        return acp_on_db(args)
    spell = load_cantrip(args.spec)
    if args.check:
        return check_spec(args.spec, spell)
    try:
        trio.run(functools.partial(serve_stdio, spell, protocol=args.protocol))
    except KeyboardInterrupt:
        pass
    finally:
        spell.loom.close()
    return 0


def run_serve(args: argparse.Namespace) -> int:
    require_extra("serve", "cantrip serve")
    from cantrip.cli._process import command_gc
    from cantrip.cli._serve import serve_until_signal
    from cantrip.protocols.asgi._responses import set_heartbeat_s
    from cantrip.protocols.http._serve import serve_http
    from cantrip.protocols.middleware._guard import BindError, Guard
    from cantrip.protocols.middleware._lifecycle import ServeOptions
    from cantrip.protocols.sessions._budgets import ServeBudgets
    from cantrip.protocols.sessions._limits import SessionLimits

    debug_log(args.log)
    try:
        guard = Guard(
            bind_host=args.host,
            allow_hosts=frozenset(h.lower() for h in args.allow_host),
            allow_origins=frozenset(args.allow_origin),
            token=_token(args.token),
            max_body=args.max_body,
            body_timeout_s=float(args.client_timeout),
        )
        guard.check_bind()
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port {args.port} is not a port number (0-65535; 0: any free)")
        limits = SessionLimits(
            max_sessions=args.max_sessions,
            idle_s=args.idle_timeout,
            budgets=ServeBudgets.parse(args.session_budget, args.token_budget),
        )
        set_heartbeat_s(args.heartbeat_s)
        collector = command_gc(args.gc_young)
    except (BindError, ValueError) as exc:
        return fail(str(exc))
    options = ServeOptions(
        grace_s=args.grace_s,
        keep_alive_s=args.keep_alive_s,
        backlog=args.backlog,
        max_running=args.max_running,
        on_busy=args.on_busy,
        a2a_push_private=args.a2a_push_private,
    )
    if args.db:
        from cantrip.cli._worker import serve_on_db

        return serve_on_db(args, guard, options, collector)
    spell = load_cantrip(args.spec)
    if args.check:
        return check_spec(args.spec, spell)
    background = None
    if args.retain_days is not None:
        from cantrip.loom._retention import keep_retained, loom_location

        location = loom_location(spell.loom)
        if location is None:
            return fail(
                "--retain-days needs a loom file ([loom] path, or --db): this loom is in memory"
            )
        background = functools.partial(keep_retained, location, args.retain_days)

    start = functools.partial(
        serve_http,
        spell,
        args.host,
        args.port,
        options=options,
        guard=guard,
        limits=limits,
        read_timeout_s=args.client_timeout,
    )
    try:
        with collector:
            failure = serve_until_signal(
                start,
                host=args.host,
                port=args.port,
                spec=args.spec,
                draining=f"draining (grace {options.grace_s:g} s)",
                background=background,
            )
        if failure is not None:
            return fail(failure)
    finally:
        spell.loom.close()
    return 0


def _token(flag: str | None) -> str | None:
    """The serve token: ``--token`` or ``$CANTRIP_TOKEN``. A token given as a flag is put
    into ``CANTRIP_TOKEN`` too, so the redactor knows its value (PROD-8)."""
    if flag:
        os.environ["CANTRIP_TOKEN"] = flag
    return os.environ.get("CANTRIP_TOKEN") or None
