"""The actions of a case: each key of ``action`` is one public API call.

A step is a mapping of action keys (``cast``, ``fork``, ``export_loom``, ...)
run in order, ``then`` nesting further steps; a key that is not in
:data:`ACTIONS` fails the case.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cantrip.conformance._matchers import Mismatch, require_keys
from cantrip.conformance._world import World, turn_at
from cantrip.loom._export import export_jsonl
from cantrip.protocols.acp._server import AcpServer


async def act(world: World, step: Mapping[str, Any]) -> None:
    """Run one action step: each key is one public API call (``then`` nests steps)."""
    for key, value in step.items():
        if key == "then":
            for then_step in steps(value):
                await act(world, then_step)
            continue
        handler = ACTIONS.get(key)
        if handler is None:
            raise Mismatch(f"action: unknown key {key!r} -- not part of the schema")
        await handler(world, value)


async def construct(world: World, value: Any) -> None:
    if value is not True:
        raise Mismatch(f"construct_cantrip takes true, not {value!r}")
    world.cantrip(strict=True)


async def cast(world: World, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise Mismatch(f"cast takes a mapping, not {value!r}")
    require_keys(value, ("intent", "llm"), "cast")
    spell = world.cantrip(value.get("llm"))
    llm = world.named(value.get("llm"))
    world.casts.append(await spell.cast_async(value.get("intent"), llm=llm))


async def mutate_identity(world: World, value: Any) -> None:
    identity = world.main.identity
    for field, new in dict(value).items():
        setattr(identity, field, new)


async def delete_turn(world: World, value: Any) -> None:
    world.loom.delete_turn(turn_at(world.loom, value).id)


async def annotate_reward(world: World, value: Any) -> None:
    require_keys(value, ("turn", "reward"), "annotate_reward")
    world.loom.annotate_reward(turn_at(world.loom, value["turn"]).id, value["reward"])


async def extract_thread(world: World, value: Any) -> None:
    threads = world.loom.threads()
    if not isinstance(value, int) or not 0 <= value < len(threads):
        raise Mismatch(f"extract_thread: no thread {value!r} (loom has {len(threads)})")
    world.extracted = threads[value]


async def fork(world: World, value: Any) -> None:
    require_keys(value, ("from_turn", "llm", "intent"), "fork")
    thread = world.loom.thread(world.last.turns[-1].id)
    sequence = value.get("from_turn")
    points = [t for t in thread if t.sequence == sequence]
    if not points:
        raise Mismatch(f"fork: the last cast's thread has no turn {sequence!r}")
    spell = world.cantrip()
    async with spell.fork(points[0], llm=world.named(value.get("llm"))) as entity:
        world.casts.append(await entity.send(value.get("intent")))


async def export_loom(world: World, value: Any) -> None:
    require_keys(value, ("format", "redaction"), "export_loom")
    if value.get("format", "jsonl") != "jsonl":
        raise Mismatch(f"export_loom: unsupported format {value.get('format')!r}")
    world.exports.append(export_jsonl(world.loom, redaction=value.get("redaction", "default")))


async def acp_exchange(world: World, value: Any) -> None:
    if not isinstance(value, list):
        raise Mismatch("acp_exchange takes a list of JSON-RPC requests")
    notes: list[dict[str, Any]] = []

    async def notify(message: dict[str, Any]) -> None:
        notes.append(message)

    server = AcpServer(world.cantrip(), notify=notify)
    async with server.running():  # its session backend runs the casts
        for request in value:
            message = {"jsonrpc": "2.0", **dict(request)}
            response = await server.handle(message)
            if response is not None:
                world.acp_responses.append(response)


ACTIONS: dict[str, Callable[[World, Any], Awaitable[None]]] = {
    "construct_cantrip": construct,
    "cast": cast,
    "mutate_identity": mutate_identity,
    "delete_turn": delete_turn,
    "annotate_reward": annotate_reward,
    "extract_thread": extract_thread,
    "fork": fork,
    "export_loom": export_loom,
    "acp_exchange": acp_exchange,
}


def steps(action: Any) -> list[Mapping[str, Any]]:
    """An ``action`` (one step or a list of them) as a list of steps."""
    if action is None:
        return []
    if isinstance(action, list):
        return [dict(step) for step in action]
    if isinstance(action, Mapping):
        return [dict(action)]
    raise Mismatch(f"action must be a mapping or a list, not {action!r}")
