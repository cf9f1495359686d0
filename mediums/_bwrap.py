"""Opt-in isolation for the bash medium: run the shell under bubblewrap (issue 13, item 7).

``BashMedium(isolation="bwrap")`` starts ``bash`` inside a `bubblewrap
<https://github.com/containers/bubblewrap>`_ sandbox (Debian package
``bubblewrap``, program ``bwrap``) instead of as a plain child process:

* ``/usr`` (with the ``/bin``, ``/lib``... links) and the few files of ``/etc``
  programs need (users' names, the loader cache, certificates, ``hosts``) are
  mounted **read-only**; everything else of the host -- the rest of ``/etc``
  (``shadow``, service credentials), home folders, ``/root``, ``/work``,
  ``/var``, ``/opt``, ``/mnt``, other temporary folders -- is **not there**;
* the working folder is the one writable host folder; ``/tmp`` is a private,
  empty tmpfs that vanishes with the shell;
* new user, pid, ipc, uts, cgroup and network namespaces: the host's processes
  and ``/proc`` are not visible (a fresh ``/proc`` shows only the sandbox's),
  and there is **no network** (not even the host's loopback) unless
  ``network=True``;
* every capability is dropped, so a shell running as root cannot remount what
  is read-only; the environment is the medium's scrubbed one;
* ``--die-with-parent``, and the sandbox's pid 1 takes every process it started
  with it, so even a ``setsid`` daemon cannot outlive the session.

The host's gate pipes are inherited file descriptors, so gates work as before.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from cantrip.medium import ConstructionError

BWRAP = "bwrap"
MISSING = (
    "isolation='bwrap' needs bubblewrap, but the program 'bwrap' is not on PATH; install it "
    "(Debian/Ubuntu: apt-get install bubblewrap) or use isolation='none' (no sandbox)"
)

_READ_ONLY = ("/usr",)
"""Host folders visible (read-only) inside; the rest of the host is not mounted."""
_ETC = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "localtime",
    "ssl",
    "ca-certificates",
    "bash.bashrc",
    "inputrc",
)
"""What programs need from ``/etc`` (users' names, the loader cache, certificates...);
never all of it (``/etc/shadow``, credentials of services)."""
_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def bwrap_path() -> str:
    """Where ``bwrap`` is, or :class:`ConstructionError` saying how to get it."""
    found = shutil.which(BWRAP, path=os.environ.get("PATH") or os.defpath)
    if found is None:
        raise ConstructionError(MISSING)
    return found


def bwrap_command(
    bwrap: str, workdir: Path, control: Path, *, network: bool, fds: tuple[int, ...] = ()
) -> list[str]:
    """The ``bwrap`` arguments that put one shell in its sandbox (``--`` not included)."""
    args = [bwrap, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    if network:
        args.append("--share-net")
    for folder in _READ_ONLY:
        if os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for name in _ETC:
        path = os.path.join("/etc", name)
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for link in _LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    args += ["--bind", str(workdir), str(workdir), "--ro-bind", str(control), str(control)]
    args += ["--remount-ro", "/", "--chdir", str(workdir)]  # the sandbox's own root, too
    return args


@functools.cache
def bwrap_problem(bwrap: str) -> str | None:
    """Why ``bwrap`` cannot make a sandbox on this machine (no user namespaces, a
    container that forbids them...), or None when it can. Asked once per process."""
    try:
        probe = subprocess.run(
            [bwrap, "--unshare-all", "--cap-drop", "ALL", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not be run: {exc}"
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip() or f"status {probe.returncode}"
        return f"bubblewrap cannot create a sandbox on this machine: {why}"
    return None
