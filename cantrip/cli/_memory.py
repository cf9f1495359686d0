"""``cantrip memory SPEC|LOOM ...``: list, search, show and forget what a cantrip remembers.

The target is a spec file (``.toml``: its loom, and its ``[memory] embedder`` so a
search can be semantic or hybrid) or a loom (an SQLite file or a ``postgresql://``
URL: text search only). The answers come from :mod:`cantrip.memory._browse`, as the
HTTP memory routes' do; ``--json`` prints them as they are, the default is lines for
people. Everything printed passes through redaction. Exit 0, 1 on an error (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cantrip._errors import CantripError
from cantrip._failure import debug_requested
from cantrip._redact import redact
from cantrip.cli._exit import EXIT_ERROR, EXIT_OK
from cantrip.cli._grammar import add_memory_parser as add_memory_parser
from cantrip.cli._grammar import loom_location
from cantrip.memory._model import MemoryStoreError

PREVIEW = 120


def run_memory(args: argparse.Namespace) -> int:
    """Run a parsed ``cantrip memory`` command; the exit code."""
    out, err = sys.stdout, sys.stderr
    try:
        return _run(args, out)
    except (CantripError, MemoryStoreError) as exc:
        if debug_requested(args):
            raise
        print(f"cantrip: {redact(' '.join(str(exc).split()))}", file=err)
        return EXIT_ERROR
    except KeyError as exc:  # show: no such item
        print(f"cantrip: {redact(str(exc.args[0]))}", file=err)
        return EXIT_ERROR


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from cantrip.loom._loom import Loom
    from cantrip.memory import _browse as browse
    from cantrip.memory._open import memory_for

    loom, embedder = _open(args.target)
    try:
        store = memory_for(loom.store, embedder=embedder)
        try:
            command = args.memory_command
            if command == "list":
                prefix = browse.parse_namespace(args.prefix)
                if args.items:
                    return _items(out, args, browse.items(store, prefix, limit=args.limit))
                found = browse.namespaces(store, prefix, limit=args.limit)
                return _lines(out, args, {"namespaces": found}, found)
            if command == "search":
                prefix = browse.parse_namespace(args.prefix)
                hits = browse.items(
                    store, prefix, query=args.query, mode=args.mode, limit=args.limit
                )
                return _items(out, args, hits)
            namespace = browse.parse_namespace(args.namespace, prefix=command == "forget")
            if command == "show":
                return _show(out, args, browse.show(store, loom, namespace, args.key))
            gone = browse.forget(store, namespace, args.key, dry_run=args.dry_run)
            verb = "would forget" if args.dry_run else "forgot"
            lines = [f"{verb} {len(gone)} item(s)"]
            lines += [f"  {g['namespace']} {g['key']}" for g in gone]
            return _lines(out, args, {"dry_run": args.dry_run, "forgotten": gone}, lines)
        finally:
            store.close()
    finally:
        if isinstance(loom, Loom):
            loom.close()


def _open(target: str) -> tuple[Any, Any]:
    """The loom a target names, and the embedder its spec names (None for a loom)."""
    from cantrip.loom._loom import Loom

    where = loom_location(target)
    if isinstance(where, Path) and where.suffix == ".toml":
        from cantrip.cli._spec_file import load_cantrip

        if not where.exists():
            raise CantripError(f"no spec file at {where}")
        spell = load_cantrip(where)
        if spell.memory is None:
            spell.loom.close()
            raise CantripError(f"{where} has no [memory] table")
        return spell.loom, spell.memory.embedder
    if isinstance(where, Path) and not where.exists():
        raise CantripError(f"no loom file at {where}")
    return Loom.open(where, create=False), None


def _lines(out: TextIO, args: argparse.Namespace, data: Any, lines: Sequence[str]) -> int:
    if args.json:
        print(redact(json.dumps(data, indent=2, default=str)), file=out)
    else:
        for line in lines:
            print(redact(line), file=out)
    return EXIT_OK


def _items(out: TextIO, args: argparse.Namespace, found: list[dict[str, Any]]) -> int:
    lines = []
    for item in found:
        score = "" if item["score"] is None else f" ({item['score']:.3f})"
        lines.append(
            f"{'/'.join(item['namespace'])} {item['key']} r{item['revision']}{score}: "
            f"{_short(item['value'])}"
        )
    return _lines(out, args, {"items": found}, lines)


def _show(out: TextIO, args: argparse.Namespace, item: dict[str, Any]) -> int:
    lines = [
        f"{'/'.join(item['namespace'])} {item['key']} (revision {item['revision']}, "
        f"updated {item['updated_at']}, created {item['created_at']})",
        f"  {_short(item['value'], None)}",
    ]
    turn = item["source_turn"]
    if turn is not None:
        lines.append(f"written by {turn['turn_id']} (entity {turn['entity_id']}, turn "
                     f"{turn['sequence']})")  # fmt: skip
        if turn["intent"]:
            lines.append(f"  intent: {turn['intent']}")
    elif item["source"] is not None:
        lines.append(f"written by {item['source'].get('turn_id')} (no longer in the loom)")
    for revision in item["revisions"][1:]:
        lines.append(f"revision {revision['revision']} ({revision['updated_at']}): "
                     f"{_short(revision['value'])}")  # fmt: skip
    return _lines(out, args, item, lines)


def _short(value: Any, limit: int | None = PREVIEW) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if limit is None or len(text) <= limit else text[:limit] + " [...]"
