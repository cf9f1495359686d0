"""The ``[circle]`` table's parts: its medium and the gates it names.

The medium is named once (MEDIUM-1: ``medium``, or its aliases ``type`` and
``circle_type``, which must agree) and may be adjusted by the table (``expose_loom``,
the bash medium's ``isolation`` and ``network``). A gate is a built-in one, by name
or alias, with its dependencies bound (a ``Path`` dependency is anchored at the spec
file's folder and hides the spec and loom files from file gates by default), or a
fixture gate that answers what the table says. Problems are appended to the caller's
list; :mod:`cantrip.spec._build` reports them all at once.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

import attrs

import gates as builtin_gates
from cantrip._errors import ConstructionError
from cantrip._gate import Gate
from cantrip._medium_names import _MEDIUMS, MEDIUM_ALIASES
from cantrip._reference import import_reference
from cantrip._suggest import did_you_mean
from cantrip.spec._tables import CircleSpec, GateSpec
from gates.fixtures import fixture_gate
from mediums.base import Medium
from mediums.bash import BashMedium
from mediums.conversation import conversation


def resolve_medium(spec: CircleSpec, strict: bool, problems: list[str]) -> Medium | None:
    declared = {
        key: value
        for key, value in (
            ("medium", spec.medium),
            ("type", spec.type),
            ("circle_type", spec.circle_type),
        )
        if value is not None
    }
    canonical = {key: MEDIUM_ALIASES.get(value, value) for key, value in declared.items()}
    if len(set(canonical.values())) > 1:
        listed = ", ".join(f"{k}={v!r}" for k, v in declared.items())
        problems.append(f"circle must declare exactly one medium; these disagree: {listed}")
        return None
    for key, name in canonical.items():
        if name not in MEDIUM_ALIASES.values():
            problems.append(
                f"circle: unknown medium {declared[key]!r} "
                f"(known: {', '.join(sorted(MEDIUM_ALIASES))})"
            )
            return None
        if name not in _MEDIUMS:
            problems.append(
                f"circle: medium {declared[key]!r} is not available in this build "
                f"(available: {', '.join(sorted(_MEDIUMS))})"
            )
            return None
    if not canonical:
        if strict:
            problems.append(
                "circle must declare a medium (MEDIUM-1): medium = "
                + " | ".join(f'"{m}"' for m in sorted(_MEDIUMS))
            )
            return None
        return conversation
    try:
        return _MEDIUMS[next(iter(canonical.values()))]()
    except ConstructionError as exc:  # its extra is not installed: one problem among all
        problems.extend(exc.problems)
        return None


def with_isolation(medium: Medium, spec: CircleSpec, problems: list[str]) -> Medium:
    """The bash medium's ``isolation``/``network`` keys (issue 13, item 7)."""
    if not isinstance(medium, BashMedium):
        problems.append(
            f"circle: isolation and network apply to the bash medium, not {medium.name}"
        )
        return medium
    changes: dict[str, Any] = {}
    if spec.isolation is not None:
        changes["isolation"] = spec.isolation
    if spec.network is not None:
        changes["network"] = spec.network
    try:
        return attrs.evolve(medium, **changes)
    except ConstructionError as exc:
        problems.append(f"circle: {exc}")
        return medium


def with_loom(medium: Medium, expose: bool, problems: list[str]) -> Medium:
    if attrs.has(type(medium)) and hasattr(medium, "expose_loom"):
        evolved: Medium = attrs.evolve(medium, expose_loom=expose)  # type: ignore[misc]
        return evolved
    if expose:
        problems.append(f"circle: the {medium.name} medium cannot expose the loom (expose_loom)")
    return medium


def protected_files(spec_file: Path | None, loom_file: str | Path | None) -> tuple[str, ...]:
    """What file gates may not read by default (issue 21): the spec file, and the
    loom with its SQLite companions (write-ahead log, shared memory, rollback journal)."""
    found: list[str] = []
    if spec_file is not None:
        found.append(str(Path(spec_file).resolve()))
    if loom_file is not None:
        loom = Path(loom_file).resolve()
        found.extend(str(loom) + suffix for suffix in ("", "-wal", "-shm", "-journal"))
    return tuple(found)


def build_gate(
    spec: str | GateSpec,
    problems: list[str],
    *,
    base_dir: Path | None,
    fs_root: Path | None,
    hidden: tuple[str, ...] = (),
) -> Gate | None:
    if isinstance(spec, str):
        spec = GateSpec(name=spec)
    is_fixture = spec.behavior is not None or spec.stateful or spec.result is not None
    if spec.import_ is not None:
        if is_fixture:
            problems.append(f"gate {spec.import_!r}: an imported gate is not a test double")
            return None
        imported = imported_gate(spec.import_, base_dir, problems)
        if imported is None:
            return None
        if spec.name is not None and spec.name != imported.name:
            imported = imported.with_options(name=spec.name)
        return _configured(
            imported, spec, problems, base_dir=base_dir, fs_root=fs_root, hidden=hidden
        )
    if spec.name is None:
        problems.append("a gate entry needs a name (a built-in) or import = 'package.module:gate'")
        return None
    builtin = builtin_gates.BUILTIN.get(spec.name)
    if builtin is None:
        for candidate in builtin_gates.BUILTIN.values():
            if spec.name in candidate.aliases:
                builtin = candidate  # aliases normalize to the canonical gate (D-002)
    if is_fixture or builtin is None:
        if not is_fixture:
            names = [
                *builtin_gates.BUILTIN,
                *(a for g in builtin_gates.BUILTIN.values() for a in g.aliases),
            ]
            hint = did_you_mean(spec.name, names) or (
                f" (built-in gates: {', '.join(sorted(builtin_gates.BUILTIN))}; or declare a "
                "fixture gate with result/behavior)"
            )
            problems.append(f"unknown gate {spec.name!r}{hint}")
            return None
        if spec.dependencies:
            problems.append(f"gate {spec.name!r}: fixture gates take no dependencies")
        try:
            g = fixture_gate(
                spec.name,
                behavior=spec.behavior,
                result=spec.result,
                error=spec.error,
                delay_ms=spec.delay_ms,
                stateful=spec.stateful,
                parameters=spec.parameters,
                description=spec.description,
            )
        except ConstructionError as exc:
            problems.extend(exc.problems)
            return None
        return g.with_options(ephemeral=spec.ephemeral)
    return _configured(builtin, spec, problems, base_dir=base_dir, fs_root=fs_root, hidden=hidden)


def imported_gate(reference: str, base_dir: Path | None, problems: list[str]) -> Gate | None:
    """The gate ``reference`` names (``"package.module:function"``), imported with the
    spec's folder searched first, then the environment (a worker imports it from its
    own). Not importable, or not a gate: one line in ``problems`` naming it."""
    try:
        with _importable_from(base_dir):
            found = import_reference(reference, "gate", "package.module:function")
    except ConstructionError as exc:
        problems.extend(exc.problems)
        return None
    if not isinstance(found, Gate):
        problems.append(
            f"gate {reference!r} is a {type(found).__name__}, not a gate: "
            "decorate the function with @cantrip.gate()"
        )
        return None
    return found


@contextlib.contextmanager
def _importable_from(folder: Path | None) -> Iterator[None]:
    """``folder`` first on the import path while the gate's module is imported."""
    if folder is None:
        yield
        return
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def _configured(
    g: Gate,
    spec: GateSpec,
    problems: list[str],
    *,
    base_dir: Path | None,
    fs_root: Path | None,
    hidden: tuple[str, ...] = (),
) -> Gate | None:
    """A built-in or imported gate with the entry's keys applied: declared parameters
    checked, description and ephemeral set, dependencies bound (paths anchored)."""
    if spec.parameters is not None:
        declared = set((spec.parameters.get("properties") or {}).keys())
        actual = set((g.parameters.get("properties") or {}).keys())
        if not declared <= actual:
            problems.append(
                f"gate {g.name!r}: declared parameters {sorted(declared - actual)} "
                f"are not parameters of the gate (it takes {sorted(actual)})"
            )
    if spec.description:
        g = g.with_options(description=spec.description)
    if spec.ephemeral:
        g = g.with_options(ephemeral=True)
    hints = get_type_hints(g.fn)
    values = {
        name: spec_path(value, base_dir, fs_root) if hints.get(name) is Path else value
        for name, value in spec.dependencies.items()
    }
    for name in g.missing_dependencies:
        # A path dependency left unset is the document's own folder.
        if hints.get(name) is Path and name not in values and base_dir is not None:
            values[name] = base_dir
    if "hidden" in g.dependencies and "hidden" not in spec.dependencies and hidden:
        values["hidden"] = hidden  # a spec that sets hidden (even to []) decides itself
    if values:
        try:
            g = g.bind(**values)
        except ConstructionError as exc:
            problems.extend(exc.problems)
            return None
    return g


def spec_path(value: Any, base_dir: Path | None, fs_root: Path | None = None) -> Path:
    """A path the spec gives: re-rooted in ``fs_root`` when there is one (the conformance
    runner's virtual filesystem), else a relative one anchored at ``base_dir``."""
    path = Path(str(value))
    if fs_root is not None:
        return fs_root / path.relative_to(path.anchor) if path.is_absolute() else fs_root / path
    if not path.is_absolute() and base_dir is not None:
        return base_dir / path
    return path
