"""The layers stand on their own: any module imports alone, nothing imports in a circle,
and the built-in gates and mediums use only the public extension points.

A module that imports only after some other module was imported first is a
layering bug that a test suite (which imports everything) never notices; so
each module here is imported in a fresh interpreter of its own.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cantrip", "gates", "mediums")

PUBLIC_FOR = {
    # what a medium may import from cantrip (docs/how-to/gates.md)
    "mediums": {"cantrip", "cantrip.medium"},
    # what a gate may import from cantrip (docs/how-to/gates.md)
    "gates": {"cantrip", "cantrip.delegation"},
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the three packages by dotted name (packages by their __init__)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> Iterator[str]:
    """Modules of ours that ``path`` imports anywhere in it (top level, inside
    functions, under TYPE_CHECKING): a circle is a circle wherever it is drawn."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` imports the submodule when there is one
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                yield target


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: set(_imports(path, name, modules)) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                group.append(item)
                if item == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_in_a_circle() -> None:
    found = circles(import_graph())
    assert not found, "import circles (a lower layer must receive what it needs): " + "; ".join(
        " <-> ".join(group) for group in found
    )


def test_the_circle_detector_finds_a_circle(tmp_path: Path) -> None:
    """The check above can fail: two modules that import each other are reported."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "cantrip" / "_a.py").write_text("from cantrip._b import x\n")
    (tmp_path / "cantrip" / "_b.py").write_text("def f():\n    from cantrip import _a\n")
    assert circles(import_graph(tmp_path)) == [["cantrip._a", "cantrip._b"]]


@pytest.mark.parametrize("package", sorted(PUBLIC_FOR))
def test_builtin_extensions_use_only_public_names(package: str) -> None:
    """The built-in gates and mediums are the model for users' own: they import
    nothing from cantrip but its public surface for them."""
    allowed = PUBLIC_FOR[package]
    offences = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for module in names:
                if module.split(".")[0] == "cantrip" and module not in allowed:
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
    assert not offences, "\n".join(offences)


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """``python -c "import X"`` works for every module X, whatever was imported before."""
    names = [n for n in module_files() if not n.endswith("__main__")]  # __main__ runs the CLI
    failures: list[str] = []
    batch = 8  # a few interpreters at a time: the machine is shared
    for start in range(0, len(names), batch):
        running = [
            (
                name,
                subprocess.Popen(
                    [sys.executable, "-c", f"import {name}"],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
            for name in names[start : start + batch]
        ]
        for name, process in running:
            _, err = process.communicate(timeout=120)
            if process.returncode != 0:
                failures.append(f"{name}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
    assert not failures, "modules that do not import alone:\n" + "\n".join(failures)


LOGGER_LEVELS = """
import importlib, logging, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
touched = sorted(
    name for name, logger in logging.Logger.manager.loggerDict.items()
    if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
    and not name.startswith("cantrip")  # our own loggers are ours to set
)
print(" ".join(touched))
"""


def test_importing_the_library_sets_no_level_on_another_librarys_logger() -> None:
    """Logging belongs to the process's owner: an import that silenced psycopg's pool
    (as importing the worker did) hid its warnings from every application that embeds
    cantrip. The commands set what they want for their own stderr (issue 29)."""
    names = [n for n in module_files() if n.startswith("cantrip") and "__main__" not in n]
    done = subprocess.run(
        [sys.executable, "-c", LOGGER_LEVELS, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.split() == []


def _imported_names(path: Path) -> Iterator[str]:
    """Every absolute module name ``path`` imports, anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_module_imports_a_private_httpx_module() -> None:
    """httpx's private modules (``httpx._decoders``, ...) may change in any release; the
    adapters' wire path decodes bodies itself (cantrip/llm/providers/_decode.py)."""
    private = sorted(
        f"{name}: {imported}"
        for name, path in module_files().items()
        for imported in _imported_names(path)
        if imported.startswith("httpx._")
    )
    assert private == []
