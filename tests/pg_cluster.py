"""A throwaway PostgreSQL server for the tests and benchmarks: initdb into a temp dir.

The PostgreSQL 15 server binaries are on the machine image (and installed by
``.ci/run`` on CI). ``initdb`` refuses to run as root, so when the tests run as
root the cluster is created and run as the unprivileged ``postgres`` user.
The server listens on 127.0.0.1 only, on a free port, with a private socket
directory; ``trust`` authentication is safe because nothing else can reach it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if candidates:
        return candidates[0]
    raise RuntimeError(
        f"PostgreSQL server binary {name!r} not found: install it "
        "(Debian: apt-get install -y postgresql)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> list[str]:
    """The prefix that runs a command as an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return []
    return [shutil.which("runuser") or "/sbin/runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres_cluster(extra_options: str = "") -> Iterator[str]:
    """Start a fresh cluster; yield its URL; stop it and delete it at the end.

    ``extra_options``: more ``-c name=value`` server settings (the benchmarks load
    ``pg_stat_statements`` to count statements)."""
    root = Path(tempfile.mkdtemp(prefix="cantrip-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    prefix = _as_user()
    if prefix:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
        os.chmod(root, 0o700)
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    subprocess.run(
        [*prefix, _bin("initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
        env=env,
    )
    options = (
        f"-k {sockets} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200 " + extra_options
    )
    start = [*prefix, _bin("pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log")]
    subprocess.run([*start, "-w", "start"], check=True, capture_output=True, env=env)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    _running[url] = (start, [*prefix, _bin("pg_ctl"), "-D", str(data)], env)
    try:
        yield url
    finally:
        _running.pop(url, None)
        subprocess.run(
            [*prefix, _bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            env=env,
        )
        shutil.rmtree(root, ignore_errors=True)


_running: dict[str, tuple[list[str], list[str], dict[str, str]]] = {}
"""The clusters started here, by URL: how to start one again, how to reach its pg_ctl."""


def stop_cluster(url: str, mode: str = "fast") -> None:
    """Stop the cluster at ``url`` (``pg_ctl stop -m fast``: every session is ended, as
    in a deploy or a failover); :func:`start_cluster` brings it back on the same port
    with the same data directory."""
    _start, ctl, env = _running[_server_url(url)]
    subprocess.run([*ctl, "-m", mode, "-w", "stop"], check=True, capture_output=True, env=env)


def start_cluster(url: str) -> None:
    start, _ctl, env = _running[_server_url(url)]
    subprocess.run([*start, "-w", "start"], check=True, capture_output=True, env=env)


def _server_url(url: str) -> str:
    """The cluster URL of a URL to any of its databases."""
    return url.rsplit("/", 1)[0] + "/postgres"


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the cluster at ``url``; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name


def server_cpu(conn: Any) -> float:
    """CPU seconds of the postmaster, its live children and the children it reaped
    (``/proc``; the benches' PostgreSQL CPU per turn)."""
    data_dir = conn.execute("SHOW data_directory").fetchone()[0]
    pid = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid:
            total += int(stat[11]) + int(stat[12])
    return total / os.sysconf("SC_CLK_TCK")
