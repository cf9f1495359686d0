"""A command's spec file: the cantrip it builds, where its loom is, and ``--check``.

``cast``, ``invoke``, ``acp``, ``serve`` and ``mcp`` all start from a spec file
(TOML); they load it the same way (a :class:`~cantrip.CantripError` names every
problem at once) and check it the same way, here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from cantrip._cantrip import Cantrip
from cantrip.spec import build_cantrip, load_spec_file


def load_cantrip(spec: Path, loom_path: Path | None = None) -> Cantrip:
    """The spec file's cantrip (a CantripError names every problem at once)."""
    doc = load_spec_file(spec)
    loom = None
    if loom_path is not None:
        from cantrip.loom._loom import Loom

        loom = Loom.open(loom_path)
    return build_cantrip(doc, base_dir=spec.resolve().parent, loom=loom)


def loom_file(spell: Cantrip) -> Path | None:
    path = getattr(spell.loom.store, "path", None)
    return Path(path) if path else None


def check_spec(spec: Path, spell: Cantrip) -> int:
    """Report what the spec loads to. Its gate providers (MCP servers) are started,
    listed and stopped, so the check shows their gates -- and any tool renamed
    because LLM providers would refuse its name -- or fails as a cast would."""
    from cantrip._providers import ProviderScope

    circle = spell.circle
    provided: list[tuple[str, str, str | None]] = []
    if circle.providers:

        async def listing() -> list[tuple[str, str, str | None]]:
            scope = await ProviderScope.enter()
            return await scope.listing(circle.providers, circle.gates)

        provided = trio.run(listing)
    gates = ", ".join([*circle.gate_names, *(gate for _, gate, _ in provided)])
    loom = loom_file(spell)
    print(
        f"ok: {spec} loads (medium {circle.medium.name}; gates {gates}; "
        f"loom {loom or 'in memory'})",
        file=sys.stderr,
    )
    for provider, gate, own in provided:
        if own is not None:
            print(
                f"  {gate}: tool {own!r} of {provider!r} (renamed: LLM providers refuse its name)",
                file=sys.stderr,
            )
    return 0
