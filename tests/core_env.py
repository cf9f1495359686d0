"""A Python environment with cantrip's core dependencies only (issue 47.2).

``pip install cantrip-runtime`` installs what ``[project] dependencies`` names, and
what those need. This builds that environment without a download: a new virtual
environment (no pip) whose site-packages holds links to exactly those distributions
of the test's own environment -- each one's files and its ``.dist-info``, found
through its ``RECORD`` -- and a path entry for this checkout's three packages
(``cantrip``, ``gates``, ``mediums``). Every other distribution (the MCP SDK, QuickJS,
hypercorn, psycopg, ...) is simply not there: imports and ``importlib`` see what a
user of the lean install would see.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The requirements of the core, and of ``extras`` (pyproject.toml)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def closure(extras: tuple[str, ...] = ()) -> dict[str, metadata.Distribution]:
    """Every installed distribution the core (and ``extras``) pulls in, by canonical
    name: the requirements, then theirs, markers evaluated here, a requirement's own
    extras followed (``hypercorn[trio]``). ``cantrip-runtime[x]`` is followed too."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(r, "") for r in requirements(extras)]
    wanted: set[tuple[str, str]] = set()
    while todo:
        requirement, via_extra = todo.pop()
        if requirement.marker is not None and not _applies(requirement.marker, via_extra):
            continue
        name = canonicalize_name(requirement.name)
        if name == "cantrip-runtime":
            todo += [(r, "") for r in requirements(tuple(requirement.extras))]
            continue
        for extra in ("", *requirement.extras):
            if (name, extra) in wanted:
                continue
            wanted.add((name, extra))
            dist = found.get(name) or metadata.distribution(requirement.name)
            found[name] = dist
            todo += [(Requirement(r), extra) for r in dist.requires or []]
    return found


def _applies(marker: Marker, extra: str) -> bool:
    return marker.evaluate({"extra": extra})


def make(where: Path, extras: tuple[str, ...] = (), *, checkout: bool = True) -> Path:
    """A virtual environment in ``where`` with the core's distributions (and
    ``extras``'), linked from this one, and this checkout on its path (unless
    ``checkout`` is false: a wheel is installed into it instead); its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120
    )
    python = where / "bin" / "python"
    site = purelib(python)
    link(site, extras)
    if checkout:
        (site / "_cantrip_checkout.pth").write_text(f"{ROOT}\n")
    return python


def purelib(python: Path) -> Path:
    """The site-packages folder of the environment of ``python``."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def link(site: Path, extras: tuple[str, ...] = ()) -> None:
    """Link every file and folder the core's distributions (and ``extras``') installed
    at the top of their site-packages into ``site``."""
    for dist in closure(extras).values():
        base = Path(str(dist.locate_file("")))
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)
