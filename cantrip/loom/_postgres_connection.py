"""Reaching a PostgreSQL loom: the first connection, the pool, and saying why it failed.

A database that cannot be reached must be a :class:`~cantrip._errors.LoomError`
that names the cause within seconds (a refused connection, a wrong password, a
missing database), and no message may carry the URL's password. The store
(:mod:`cantrip.loom._postgres`) opens its pool here; the command line prints a
loom's URL through :func:`safe_url`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from cantrip._errors import LoomError
from cantrip._install import require_extra
from cantrip._redact import redact

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

POOL_TIMEOUT_S = 5.0
"""How long a call waits for a pool connection before it fails (psycopg_pool's default is
30 s): callers are bounded by ``PostgresStore.limiter`` to the pool's size, so a wait
this long means the database is unreachable -- fail and let the caller's retry loop
back off, instead of hanging for half a minute after the database is back."""


def open_pool(url: str, max_connections: int) -> ConnectionPool:
    """An open ``psycopg_pool.ConnectionPool`` on ``url`` (autocommit connections),
    after one direct connection (:func:`probe_connection`) has said the server answers."""
    require_extra("postgres", "a postgresql:// loom")
    import psycopg_pool

    probe_connection(url)
    pool = psycopg_pool.ConnectionPool(
        url,
        min_size=1,
        max_size=max_connections,
        kwargs={"autocommit": True, "connect_timeout": 5},
        open=False,
        timeout=POOL_TIMEOUT_S,
    )
    try:
        pool.open(wait=True, timeout=10.0)
    except psycopg_pool.PoolTimeout as exc:
        pool.close()
        raise LoomError(f"cannot connect to PostgreSQL at {safe_url(url)}: {exc}") from None
    return pool


CONNECT_TIMEOUT_S = 2
"""Seconds a first connection may take before the loom says the server does not answer."""


def probe_connection(url: str) -> None:
    """One direct connection before the pool opens, so a server that refuses, a wrong
    password or a missing database is a :class:`LoomError` naming that cause within
    :data:`CONNECT_TIMEOUT_S` -- the pool only says "initialization incomplete" after
    its own 10 s."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True):
            return
    except psycopg.OperationalError as exc:
        raise LoomError(
            f"cannot connect to PostgreSQL at {safe_url(url)}: {connect_cause(exc)}"
        ) from None
    except psycopg.ProgrammingError as exc:  # a URL psycopg cannot parse
        raise LoomError(f"not a PostgreSQL URL ({safe_url(url)}): {exc}") from None


def connect_cause(exc: BaseException) -> str:
    """The cause of a failed connection in a few words (never the URL or password)."""
    text = " ".join(str(exc).split())
    lowered = text.lower()
    if "password authentication failed" in lowered or "authentication failed" in lowered:
        return "authentication failed (check the user and password)"
    database = re.search(r'database "([^"]+)" does not exist', text)
    if database is not None:
        name = database.group(1)
        return f"no such database {name!r} (create it with: createdb {name})"
    if "refused" in lowered:
        return "connection refused (is PostgreSQL running there, on that port?)"
    if "timeout" in lowered or "timed out" in lowered:
        return f"no answer within {CONNECT_TIMEOUT_S} s (is the host reachable?)"
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return "the host name does not resolve"
    if "role" in lowered and "does not exist" in lowered:
        found = re.search(r'role "([^"]+)" does not exist', text)
        return f"no such user {found.group(1)!r}" if found else "no such user"
    return redact(text)[:300]


def safe_url(url: str) -> str:
    """The URL without its password (secrets never reach a message, PROD-8)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return "postgresql://..."
    try:
        parts = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 -- a malformed URL: say nothing of it
        return "postgresql://..."
    host, port = str(parts.get("host", "")), str(parts.get("port", ""))
    user, db = str(parts.get("user", "")), str(parts.get("dbname", ""))
    return f"postgresql://{user + '@' if user else ''}{host}{':' + port if port else ''}/{db}"
