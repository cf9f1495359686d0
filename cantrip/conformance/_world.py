"""A case's world: what its setup declares, and everything its actions produce.

Setup keys become a declarative spec document plus named scripted LLMs (every
LLM key: ``llm``, ``llm_*``, ``*_llm``); the cantrips are built from the
document on first use. Actions write into the world, expectations read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from cantrip._cantrip import Cantrip
from cantrip._outcome import CastResult
from cantrip.conformance._matchers import Mismatch
from cantrip.llm._contract import LLM
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.spec import LLMSpec, SpecDocument, build_cantrip, build_llm, parse_spec

MAIN_LLM = "llm"


def is_llm_key(key: str) -> bool:
    """Setup keys that declare an LLM: ``llm``, ``llm_*``, ``*_llm`` and ``*_llm_*``."""
    return key == MAIN_LLM or key.startswith("llm_") or key.endswith("_llm") or "_llm_" in key


@attrs.define
class World:
    """Everything a case's actions produced, for its expectations to read."""

    doc: SpecDocument
    llms: dict[str, LLM]
    """Named LLMs by setup key (``llm`` is the cantrip's own)."""
    registry: dict[str, LLM]
    """Named LLMs by the name casts and children use."""
    loom: Loom
    fs_root: Path
    cantrips: dict[str | None, Cantrip] = attrs.field(factory=dict)
    casts: list[CastResult] = attrs.field(factory=list)
    error: BaseException | None = None
    extracted: list[Turn] | None = None
    exports: list[str] = attrs.field(factory=list)
    logs: list[str] = attrs.field(factory=list)
    acp_responses: list[dict[str, Any]] = attrs.field(factory=list)

    def cantrip(self, llm_name: str | None = None, *, strict: bool = False) -> Cantrip:
        """The case's cantrip. Without an ``llm`` of its own, a cast that names an
        LLM gets the cantrip built with that LLM (the swap of spec 2.2)."""
        main = self.llms.get(MAIN_LLM)
        key = None if main is not None or llm_name is None else llm_name
        if strict or key not in self.cantrips:
            built = build_cantrip(
                self.doc,
                strict_medium=strict,
                base_dir=self.fs_root,
                fs_root=self.fs_root,
                llms=self.registry,
                loom=self.loom,
                llm=main if key is None else self.named(key),
            )
            if strict:
                return built
            self.cantrips[key] = built
        return self.cantrips[key]

    def named(self, llm_name: str | None) -> LLM | None:
        if llm_name is None:
            return None
        llm = self.registry.get(llm_name)
        if llm is None:
            raise Mismatch(f"the case names unknown llm {llm_name!r}")
        return llm

    @property
    def main(self) -> Cantrip:
        if None in self.cantrips:
            return self.cantrips[None]
        return next(iter(self.cantrips.values()))

    @property
    def last(self) -> CastResult:
        if not self.casts:
            raise Mismatch("no cast completed")
        return self.casts[-1]


def build_world(setup: dict[str, Any], tmp: Path) -> World:
    """A fresh world for a case's ``setup``: its files under ``tmp``, its spec
    document and its named scripted LLMs (a setup problem fails the case)."""
    fs_root = tmp / "fs"
    fs_root.mkdir()
    if "filesystem" in setup:
        for raw_path, content in (setup.pop("filesystem") or {}).items():
            target = fs_root / Path(raw_path).relative_to(Path(raw_path).anchor)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(content), encoding="utf-8")
    llm_specs = {k: setup.pop(k) for k in list(setup) if is_llm_key(k)}
    main_spec = llm_specs.pop(MAIN_LLM, None)
    doc = parse_spec({**setup, MAIN_LLM: main_spec}, source="setup")
    problems: list[str] = []
    llms: dict[str, LLM] = {}
    registry: dict[str, LLM] = {}
    if doc.llm is not None:
        built = build_llm(shared_script(doc.llm), problems, MAIN_LLM)
        if built is not None:
            llms[MAIN_LLM] = built
    for key, raw in llm_specs.items():
        spec = parse_spec({MAIN_LLM: raw}, source=f"setup.{key}").llm
        if spec is None:
            continue
        named = shared_script(spec).model_copy(update={"name": spec.name or key})
        built = build_llm(named, problems, key)
        if built is not None:
            llms[key] = built
            registry[spec.name or key] = built
    if problems:
        raise Mismatch("setup: " + "; ".join(problems))
    return World(doc=doc, llms=llms, registry=registry, loom=Loom(), fs_root=fs_root)


def shared_script(spec: LLMSpec) -> LLMSpec:
    """A vector's scripted LLMs share one cursor, in query order, unless the vector
    says otherwise: the reference vectors interleave a parent's and its children's
    answers in one script and count queries across casts (SPEC.md "Conformance")."""
    if spec.script is not None:
        return spec
    return spec.model_copy(update={"script": "shared"})


def turn_at(loom: Loom, index: Any) -> Turn:
    """The loom's turn at ``index`` (in recording order), as actions and
    expectations name turns."""
    turns = loom.turns
    if not isinstance(index, int) or not 0 <= index < len(turns):
        raise Mismatch(f"no turn {index!r} in the loom (it has {len(turns)})")
    return turns[index]
