"""``cantrip loom FILE ...``: inspect, export, reward and fork from a loom file.

Subcommands (FILE is a loom written by ``cantrip cast --loom`` or ``[loom]
path``: ``.jsonl`` or SQLite):

- ``list`` -- every entity (medium, parent or fork origin, turns, tokens) and
  every thread (leaf, entity, length, outcome, tokens, reward);
- ``show REF`` -- a thread turn by turn: utterance, gate calls, observation,
  tokens, duration, outcome and reward;
- ``export [--format jsonl|chat|otlp] [--thread REF] [--raw]`` -- turn JSONL,
  chat-format training data (one conversation per thread) or OTLP/JSON traces
  (GenAI conventions, no message content) on stdout;
  redacted unless ``--raw`` is given;
- ``reward REF VALUE`` -- set (or, with ``none``, clear) a turn's reward;
- ``fork REF SPEC.toml INTENT [--llm NAME] [--json]`` -- continue from a turn
  with the cantrip a spec file describes, recording into the same loom;
- ``view [--host 127.0.0.1] [--port 0] [--token T]`` -- browse the loom in a
  web browser: a read-only local server that prints its URL and opens nothing.
- ``check [--json]`` -- SQLite's integrity check and a count of what is
  readable (exit 0 intact, 1 damaged); reads only;
- ``recover NEW [--json]`` -- copy every complete turn (readable, with its
  entity and parent) into the new loom file NEW; the damaged file is only read.

A file that is not a loom (a text file, another program's database) is refused
with one line and never written to; a damaged loom's error names ``check`` and
``recover``.

REF names a turn: a turn id or a unique prefix or suffix of one (ids begin
with a clock, so the end of an id is what tells turns of one run apart;
``turn-`` may be left out of a prefix), ``ENTITY:SEQ`` (sequence SEQ on that
entity's thread; the entity id may be a unique prefix), ``#N`` (the leaf of
thread N as ``list`` numbers them), or an entity id (its latest turn).
``show`` shows the thread from the root to that turn.

Everything printed passes through redaction (PROD-8), except ``export --raw``.
Exit codes: 0 success (``fork``: terminated), 2 (``fork``: truncated by a
ward), 1 error (``check``: the loom is damaged).
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from cantrip._chat_export import export_chat
from cantrip._errors import CantripError, LoomError
from cantrip._failure import debug_requested, leaves
from cantrip._install import require_extra
from cantrip._redact import redact
from cantrip.cli._exit import EXIT_ERROR, EXIT_OK, exit_for
from cantrip.cli._grammar import add_loom_parser as add_loom_parser
from cantrip.cli._grammar import loom_location as loom_location
from cantrip.loom._export import Redaction, export_jsonl
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._postgres_connection import safe_url
from cantrip.loom._repair import damaged_hint
from cantrip.loom._summary import cost as _cost
from cantrip.loom._summary import cost_text
from cantrip.loom._summary import outcome as _outcome
from cantrip.loom._summary import tokens as _tokens
from cantrip.loom._summary import tree_turns as _tree_turns
from cantrip.loom._view import reasoning_summary

READ_ONLY = frozenset({"list", "show", "export", "stats"})
"""Commands that only read: the loom file is opened read-only and never changes."""
PREVIEW = 400


def run_loom(args: argparse.Namespace) -> int:
    """Run a parsed ``cantrip loom`` command; the exit code."""
    out, err = sys.stdout, sys.stderr
    path: Path | str = args.loom_file
    if isinstance(path, Path) and not path.exists():
        print(f"cantrip: no loom file at {path}", file=err)
        return EXIT_ERROR
    if isinstance(path, str) and args.loom_command in ("check", "recover"):
        print(
            f"cantrip: {args.loom_command} reads a loom file page by page; a PostgreSQL loom "
            "is kept whole by PostgreSQL itself",
            file=err,
        )
        return EXIT_ERROR
    if args.loom_command == "view":
        return _view(args, err)
    try:
        return _run(args, path, out, err)
    except CantripError as exc:
        if debug_requested(args):
            raise  # the caller prints the traceback
        print(f"cantrip: {redact(' '.join(str(exc).split()))}", file=err)
        return EXIT_ERROR
    except sqlite3.DatabaseError as exc:
        if debug_requested(args) or isinstance(
            exc, sqlite3.ProgrammingError | sqlite3.InterfaceError
        ):
            raise  # how cantrip used SQLite: a bug, with its traceback
        print(f"cantrip: {path} is a damaged loom ({exc}); {damaged_hint(path)}", file=err)
        return EXIT_ERROR


def _run(args: argparse.Namespace, path: Path | str, out: TextIO, err: TextIO) -> int:
    if args.loom_command in ("check", "recover"):
        return _repair(args, out, err)
    # a foreign or damaged file, or a database holding no loom, is a LoomError saying which
    read_only = args.loom_command in READ_ONLY
    loom = Loom.open(path, create=False, read_only=read_only)
    try:
        command = args.loom_command
        if command == "list":
            return _list(loom, args, out)
        if command == "show":
            return _show(loom, args, out)
        if command == "export":
            return _export(loom, args, out, err)
        if command == "reward":
            return _reward(loom, args, out)
        if command == "prune":
            return _prune(loom, args, out)
        if command == "stats":
            return _stats(loom, args, out)
        return _fork(loom, args, out, err)
    finally:
        loom.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cantrip.cli._loom FILE COMMAND ...`` (the same as ``cantrip loom``,
    with the same one-line errors; ``--debug`` shows a traceback)."""
    from cantrip._failure import debug_requested, report

    parser = argparse.ArgumentParser(prog="cantrip")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_loom_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["loom", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(run_loom(args))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 -- the command's boundary: one line
        return report(exc, debug=debug_requested(args), stream=sys.stderr)


def _repair(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from cantrip.loom import _repair as repair

    if args.loom_command == "check":
        found = repair.check(args.loom_file)
    else:
        found = repair.recover(args.loom_file, args.out, Loom.open)
    if args.json:
        _print(out, repair.dumps(found))
    else:
        for line in repair.report_lines(found):
            _print(out, line)
        if args.loom_command == "recover":
            _print(
                out,
                f"recovered {len(found.turns)} complete turn(s) of {len(found.entities)} "
                f"entit(ies) into {args.out}",
            )
    if args.loom_command == "check":
        return EXIT_OK if found.intact else EXIT_ERROR
    return EXIT_OK


# -- references ------------------------------------------------------------------


def resolve_ref(loom: Loom, ref: str) -> Turn:
    """The turn a REF names (see the module docstring)."""
    ref = ref.strip()
    if not ref:
        raise LoomError("empty turn reference")
    if ref.startswith("#"):
        leaves = loom.leaves()
        try:
            index = int(ref[1:])
        except ValueError:
            raise LoomError(f"{ref!r}: a thread number is #1, #2, ...") from None
        if not 1 <= index <= len(leaves):
            raise LoomError(f"{ref!r}: the loom has {len(leaves)} thread(s)")
        return leaves[index - 1]
    if ":" in ref:
        who, _, seq = ref.rpartition(":")
        try:
            sequence = int(seq)
        except ValueError:
            raise LoomError(f"{ref!r}: ENTITY:SEQ needs a number after the colon") from None
        return loom.find(_entity(loom, who), sequence)
    try:
        return loom.get(ref)
    except LoomError:
        pass
    if ref in loom.entities:
        return _last_of(loom, ref)
    turns = [
        t.id
        for t in loom.turns
        if t.id.startswith(ref) or t.id.startswith("turn-" + ref) or t.id.endswith(ref)
    ]
    entities = [e for e in loom.entities if e.startswith(ref) or e.startswith("entity-" + ref)]
    if len(turns) == 1 and not entities:
        return loom.get(turns[0])
    if len(entities) == 1 and not turns:
        return _last_of(loom, entities[0])
    if not turns and not entities:
        hint = f" (thread {ref} is #{ref}; turn {ref} of an entity is ENTITY:{ref})"
        raise LoomError(f"no turn or entity matches {ref!r}" + (hint if ref.isdigit() else ""))
    raise LoomError(
        f"{ref!r} is ambiguous: {len(turns)} turn(s) and {len(entities)} entity(ies) match"
    )


def _entity(loom: Loom, who: str) -> str:
    if who in loom.entities:
        return who
    found = [e for e in loom.entities if e.startswith(who) or e.startswith("entity-" + who)]
    if len(found) != 1:
        raise LoomError(f"{who!r} names {len(found)} entities; give more of the id")
    return found[0]


def _last_of(loom: Loom, entity_id: str) -> Turn:
    last = loom.last_turn(entity_id)
    if last is None:
        raise LoomError(f"entity {entity_id} has no turns")
    return last


# -- list --------------------------------------------------------------------------


def _list(loom: Loom, args: argparse.Namespace, out: TextIO) -> int:
    entities: list[dict[str, Any]] = []
    for record in loom.entities.values():
        turns = loom.entity_turns(record.entity_id)
        last = turns[-1] if turns else None
        entities.append(
            {
                "entity_id": record.entity_id,
                "medium": record.medium,
                "llm": record.llm,
                "parent_entity_id": record.parent_entity_id,
                "forked_from": record.forked_from,
                "fork_strategy": record.fork_strategy,
                "turns": len(turns),
                "outcome": _outcome(last) if last else "no turns",
                "tokens": _tokens(turns),
                "cost_usd": _cost(turns),
                "tree_cost_usd": _cost(_tree_turns(loom, record.entity_id)),
                "created_at": record.created_at,
            }
        )
    threads: list[dict[str, Any]] = []
    for number, leaf in enumerate(loom.leaves(), start=1):
        thread = loom.thread(leaf.id)
        threads.append(
            {
                "thread": f"#{number}",
                "leaf": leaf.id,
                "entity_id": leaf.entity_id,
                "turns": len(thread),
                "outcome": _outcome(leaf),
                "result": leaf.result if leaf.terminated else None,
                "tokens": _tokens(thread),
                "cost_usd": _cost(thread),
                "reward": loom.reward(leaf.id),
            }
        )
    if args.json:
        _print(out, json.dumps({"entities": entities, "threads": threads}, default=str))
        return EXIT_OK
    _print(out, f"entities ({len(entities)}):")
    for e in entities:
        origin = ""
        if e["parent_entity_id"]:
            origin = f"  child of {e['parent_entity_id']}"
        elif e["forked_from"]:
            origin = f"  forked from {e['forked_from']} ({e['fork_strategy']})"
        t = e["tokens"]
        _print(
            out,
            f"  {e['entity_id']}  {e['medium']}  llm={e['llm'] or '-'}  {e['turns']} turn(s)  "
            f"{e['outcome']}  tokens {t['prompt']}+{t['completion']}  "
            f"{cost_text(e['cost_usd'])} (tree {cost_text(e['tree_cost_usd'])}){origin}",
        )
    _print(out, f"threads ({len(threads)}):")
    for th in threads:
        t = th["tokens"]
        reward = "" if th["reward"] is None else f"  reward {th['reward']}"
        result = "" if th["result"] is None else f"  result {_short(_text(th['result']), 60)}"
        _print(
            out,
            f"  {th['thread']}  {th['leaf']}  {th['entity_id']}  {th['turns']} turn(s)  "
            f"{th['outcome']}  tokens {t['prompt']}+{t['completion']}  "
            f"{cost_text(th['cost_usd'])}{result}{reward}",
        )
    return EXIT_OK


# -- show --------------------------------------------------------------------------


def _show(loom: Loom, args: argparse.Namespace, out: TextIO) -> int:
    target = resolve_ref(loom, args.ref)
    thread = loom.thread(target.id)
    limit = None if args.full else PREVIEW
    _print(
        out,
        f"thread to {target.id}: {len(thread)} turn(s), {cost_text(_cost(thread))}; "
        f"entity tree {cost_text(_cost(_tree_turns(loom, target.entity_id)))}",
    )
    for turn in thread:
        meta = turn.metadata
        phase = turn.extras.get("phase")
        _print(
            out,
            f"\n-- turn {turn.sequence}  {turn.id}  {turn.entity_id}"
            + (f"  [{phase}]" if phase else ""),
        )
        _print(
            out,
            f"   tokens {meta.tokens_prompt} prompt / {meta.tokens_completion} completion / "
            f"{meta.tokens_cached} cached   {meta.duration_ms:.1f} ms"
            + (f"   attempts {meta.attempts}" if meta.attempts != 1 else "")
            + (f"   {cost_text(_cost((turn,)))}" if turn.metadata.model or meta.cost_usd else ""),
        )
        if turn.intent is not None:
            _block(out, "intent", turn.intent, limit)
        if turn.thinking:
            _block(out, "thinking", turn.thinking, limit)
        if turn.reasoning:
            _print(out, f"   reasoning: {reasoning_summary(turn.reasoning)}")
        if turn.utterance:
            _block(out, "utterance", turn.utterance, limit)
        if turn.gate_calls:
            _print(out, "   gate calls:")
            for r in turn.gate_calls:
                status = "" if r.status == "ok" else f" [{r.status}]"
                via, cut = r.detail.get("via"), r.detail.get("result_cut")
                status += f"  (via {via})" if via else ""
                if isinstance(cut, Mapping):
                    status += f"  (stored {cut.get('kept')} of {cut.get('chars')} characters)"
                _print(
                    out,
                    f"     {r.gate}({_short(r.arguments, limit)}) -> "
                    f"{'ERROR ' if r.is_error and r.status == 'error' else ''}"
                    f"{_short(r.text, limit)}{status}",
                )
        if turn.observation:
            _block(out, "observation", turn.observation, limit)
        if turn.terminated or turn.truncated:
            result = f": {_short(_text(turn.result), limit)}" if turn.terminated else ""
            _print(out, f"   {_outcome(turn)}{result}")
        reward = loom.reward(turn.id)
        if reward is not None:
            _print(out, f"   reward {reward}")
    return EXIT_OK


def _block(out: TextIO, label: str, text: str, limit: int | None) -> None:
    _print(out, f"   {label}:")
    for line in _short(text, limit).splitlines() or [""]:
        _print(out, f"     {line}")


# -- export / reward / fork ----------------------------------------------------------


def _export(loom: Loom, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    redaction: Redaction = "none" if args.raw else "default"
    if args.raw:
        print("cantrip: raw export: secrets are NOT redacted", file=err)
    leaf = resolve_ref(loom, args.thread).id if args.thread else None
    if args.format == "otlp":
        from cantrip.tracing._otlp import export_otlp

        text = export_otlp(loom)  # content-free: tokens, timings, names, statuses
    elif args.format == "chat":
        text = export_chat(loom, None if leaf is None else [leaf], redaction=redaction)
    else:
        turns = None if leaf is None else loom.thread(leaf)
        text = export_jsonl(loom, turns, redaction=redaction)
    out.write(text)  # already redacted unless --raw was asked for
    return EXIT_OK


def _reward(loom: Loom, args: argparse.Namespace, out: TextIO) -> int:
    turn = resolve_ref(loom, args.ref)
    raw = str(args.value).strip().lower()
    value: float | None
    if raw in ("none", "null", "-"):
        value = None
    else:
        try:
            value = float(raw)
        except ValueError:
            raise LoomError(f"reward must be a number or none, not {args.value!r}") from None
    loom.annotate_reward(turn.id, value)
    _print(out, f"reward of {turn.id} (turn {turn.sequence} of {turn.entity_id}): {value}")
    return EXIT_OK


def _fork(loom: Loom, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from cantrip.spec import build_cantrip, load_spec_file

    point = resolve_ref(loom, args.ref)
    spell = build_cantrip(load_spec_file(args.spec), base_dir=args.spec.resolve().parent, loom=loom)
    recorded = loom.entity(point.entity_id).medium
    if recorded != spell.circle.medium.name:
        print(
            f"cantrip: note: the turn was recorded in the {recorded} medium and the spec "
            f"uses {spell.circle.medium.name}; its sandbox state is not carried over",
            file=err,
        )

    async def run() -> Any:
        async with spell.fork(point, llm=args.llm) as entity:
            return await entity.send(args.intent)

    outcome = trio.run(run)
    if args.json:
        _print(
            out,
            json.dumps(
                {
                    "result": outcome.result,
                    "terminated": outcome.terminated,
                    "truncated": outcome.truncated,
                    "reason": outcome.reason,
                    "turns": len(outcome.turns),
                    "entity_id": outcome.entity_id,
                    "forked_from": point.id,
                    "leaf": outcome.turns[-1].id if outcome.turns else None,
                    "usage": outcome.usage.to_dict(),
                    "summary": outcome.summary,
                },
                default=str,
            ),
        )
    elif outcome.terminated:
        _print(out, outcome.text)
    else:
        print(redact(outcome.summary or "truncated"), file=err)
    return exit_for(outcome.terminated, outcome.reason)


def _prune(loom: Loom, args: argparse.Namespace, out: TextIO) -> int:
    from cantrip.loom._retention import parse_date, prune

    before = parse_date(args.before) if args.before is not None else None
    done = prune(
        loom,
        before=before,
        keep_last=args.keep_last,
        entity=args.entity,
        archive=args.archive,
        dry_run=args.dry_run,
        busy_s=args.idle_s,
    )
    memories = _prune_memories(loom, done.plan.entities, args) if args.memories else None
    if args.json:
        report = done.to_dict()
        if memories is not None:
            report["memories"] = [{"namespace": list(ns), "key": key} for ns, key in memories]
        _print(out, json.dumps(report, indent=2))
        return 0
    plan = done.plan
    verb = "would remove" if args.dry_run else "removed"
    _print(
        out,
        f"{verb} {len(plan.roots)} root entities ({len(plan.entities)} with children), "
        f"{plan.turns} turns"
        + (f"; archived to {done.archive}" if done.archive else "")
        + (
            ""
            if args.dry_run
            else f"; {done.bytes_before / 1e6:.1f} MB -> {done.bytes_after / 1e6:.1f} MB "
            f"in {done.seconds:.2f} s"
        ),
    )
    for entity_id, why in plan.kept:
        _print(out, f"kept {entity_id}: {why}")
    if memories is not None:
        _print(out, f"{'would forget' if args.dry_run else 'forgot'} {len(memories)} memories")
        for namespace, key in memories:
            _print(out, f"  {'/'.join(namespace)} {key}")
    return 0


def _prune_memories(
    loom: Loom, entities: Sequence[str], args: argparse.Namespace
) -> list[tuple[tuple[str, ...], str]]:
    """``prune --memories``: the memories the pruned sessions wrote, forgotten unless
    ``--dry-run`` (cantrip.memory.forget_derived)."""
    from cantrip.memory import forget_derived, memory_for

    store = memory_for(loom.store)
    try:
        return forget_derived(store, entities, dry_run=args.dry_run)
    finally:
        store.close()


def _stats(loom: Loom, args: argparse.Namespace, out: TextIO) -> int:
    from cantrip.loom._retention import stats

    figures = stats(loom)
    if args.json:
        _print(out, json.dumps(figures, indent=2))
        return 0
    _print(
        out,
        f"{figures['entities']} entities ({figures['roots']} roots), {figures['turns']} turns, "
        f"{figures['bytes'] / 1e6:.2f} MB",
    )
    _print(out, f"oldest {figures['oldest'] or '-'}, newest {figures['newest'] or '-'}")
    for table, size in figures["tables"].items():
        _print(out, f"  {table}: {size / 1e6:.2f} MB")
    return 0


def _view(args: argparse.Namespace, err: TextIO) -> int:
    """``loom FILE view``: serve the browser viewer until Ctrl-C; prints the URL."""
    require_extra("serve", "cantrip loom view")
    from cantrip.cli._serve import serve_until_signal
    from cantrip.protocols.middleware._guard import BindError
    from cantrip.protocols.viewer._app import serve_viewer, viewer_guard

    shown = safe_url(args.loom_file) if isinstance(args.loom_file, str) else args.loom_file

    try:
        guard = viewer_guard(args.host, args.token)
    except BindError as exc:
        print(f"cantrip: {exc}", file=err)
        return EXIT_ERROR

    token_note = "cantrip: a token is required: open the page as URL/?token=TOKEN"
    try:
        failure = serve_until_signal(
            functools.partial(serve_viewer, args.loom_file, args.host, args.port, guard=guard),
            host=args.host,
            port=args.port,
            spec=shown,
            draining=None,
            announce=lambda bind: f"cantrip: viewing {shown} at {bind}/",
            then=[token_note] if guard.token is not None else [],
            err=err,
        )
    except BaseException as exc:
        found = leaves(exc)  # a loom that cannot be read, inside the server's nurseries
        if not all(isinstance(leaf, CantripError) for leaf in found):
            raise
        print(f"cantrip: cannot read {shown}: {redact(str(found[0]))}", file=err)
        return EXIT_ERROR
    if failure is not None:
        print(f"cantrip: {failure}", file=err)
        return EXIT_ERROR
    return EXIT_OK


# -- output ---------------------------------------------------------------------------


def _print(out: TextIO, text: str) -> None:
    print(redact(text), file=out)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _short(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text)} chars]"


if __name__ == "__main__":
    sys.exit(main())
