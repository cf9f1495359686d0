"""``cantrip init``: write the starter spec that ships inside the package.

An installed wheel has no ``examples/`` folder, so the first run after ``pip install``
needs a spec from somewhere: this writes one (``starter.toml``, package data) that runs
offline with a scripted LLM and says which lines to change for a real provider.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

STARTER = "starter.toml"
DEFAULT_NAME = "hello.toml"


def starter_text() -> str:
    """The starter spec as shipped in the package."""
    return resources.files("cantrip.cli").joinpath(STARTER).read_text(encoding="utf-8")


def add_init_parser(
    commands: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Add ``init`` to a ``cantrip`` parser."""
    init: argparse.ArgumentParser = commands.add_parser(
        "init", parents=list(parents), help="write a starter spec file (runs offline)"
    )
    init.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=Path(DEFAULT_NAME),
        help=f"where to write it: a file, or a folder to write {DEFAULT_NAME} into "
        f"(default: ./{DEFAULT_NAME})",
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    return init


def run_init(args: argparse.Namespace) -> int:
    """Write the starter; an existing file is left alone unless ``--force``."""
    path: Path = args.path
    if path.is_dir():
        path = path / DEFAULT_NAME
    if path.exists() and not args.force:
        print(f"cantrip: {path} exists; --force overwrites it", file=sys.stderr)
        return 1
    try:
        path.write_text(starter_text(), encoding="utf-8")
    except OSError as exc:
        print(f"cantrip: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(
        f'cantrip: wrote {path}; try: cantrip cast {path} "Greet the world, then finish."',
        file=sys.stderr,
    )
    return 0
