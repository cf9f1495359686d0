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
    "gates": {"cantrip", "cantrip.delegation", "cantrip.memory"},
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


IMPORT_EACH = """
import os, sys
package, names, running, failures = sys.argv[1], sys.argv[2:], {}, []
__import__(package)  # what importing any module of it does first, in any interpreter


def reap():
    pid, status = os.wait()
    name, out = running.pop(pid)
    message = os.read(out, 65536).decode(errors="replace").strip()
    os.close(out)
    if os.waitstatus_to_exitcode(status) != 0:
        failures.append(f"{name}: {message or 'exit status ' + str(status)}")


for name in names:
    if len(running) >= 4:  # a few at a time: the machine is shared
        reap()
    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: this interpreter as it was after the package's import
        os.close(out)
        try:
            __import__(name)
        except BaseException as exc:
            import traceback

            os.write(into, traceback.format_exception_only(exc)[-1].encode())
            os._exit(1)
        os._exit(0)
    os.close(into)
    running[pid] = (name, out)
while running:
    reap()
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """``python -c "import X"`` works for every module X, whatever was imported before.

    Importing ``pkg.a.b`` in a fresh interpreter first runs all of ``pkg/__init__.py``,
    then imports ``pkg.a`` and ``pkg.a.b``. So one fresh interpreter per top-level
    package imports the package and forks a child per module of it: each child starts
    from exactly the state a fresh ``import pkg.a.b`` reaches before importing ``pkg.a``
    -- without paying ~0.5 s of interpreter start and package import 170 times (that
    made this the suite's slowest test). A failing package import fails its interpreter."""
    names = [n for n in module_files() if not n.endswith("__main__")]  # __main__ runs the CLI
    failures: list[str] = []
    for package in PACKAGES:
        mine = [n for n in names if n.split(".")[0] == package and n != package]
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_EACH, package, *mine],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            lines = done.stdout.strip().splitlines() or done.stderr.strip().splitlines()[-1:]
            failures.extend(lines or [f"{package}: exit status {done.returncode}"])
    assert not failures, "modules that do not import alone:\n" + "\n".join(failures)


def test_the_import_check_finds_a_module_that_imports_only_after_another(
    tmp_path: Path,
) -> None:
    """The check above can fail: a module that uses a sibling it never imported imports
    after that sibling only; imported alone, in its own child, it fails -- and so does
    a package whose own import fails."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("import pkg\n\nY = pkg.a.X\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n\nY = pkg.a.X\n")
    checked = ["pkg.a", "pkg.b", "pkg.c"]
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, "pkg", *checked],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout.strip().splitlines() == [
        "pkg.b: AttributeError: module 'pkg' has no attribute 'a'"
    ]
    # in one interpreter, after pkg.a, pkg.b imports: only a fresh start catches it
    together = subprocess.run(
        [sys.executable, "-c", "import pkg.a, pkg.b"], cwd=tmp_path, capture_output=True
    )
    assert together.returncode == 0
    (tmp_path / "pkg" / "__init__.py").write_text("import nowhere\n")
    broken = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, "pkg", *checked],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert broken.returncode == 1 and "No module named 'nowhere'" in broken.stderr


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


def room_of(module: str) -> str:
    """The room a module stands in: a folder of ``cantrip/`` is one room (its package
    face included), a top-level file of ``cantrip/`` is a room of its own, and ``gates``
    and ``mediums`` are one room each -- the granularity a reader maps the house at."""
    parts = module.split(".")
    if parts[0] != "cantrip" or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Imports between rooms. The package face ``cantrip`` is left out: its re-exports
    (some lazy, through ``__getattr__``) name every room by design, and what imports the
    face (gates, user code) stands above all of them."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "cantrip":
            continue
        mine = rooms.setdefault(room_of(module), set())
        for target in targets:
            if target != "cantrip" and room_of(target) != room_of(module):
                mine.add(room_of(target))
    for targets in list(rooms.values()):
        for target in targets:
            rooms.setdefault(target, set())
    return rooms


def test_no_import_runs_back_up_between_rooms() -> None:
    """The rooms stand on floors: each above every room it imports. Two rooms that
    import each other -- even through others, even by one lazy import in a function --
    have no floor order, so one of those imports runs back up (SPEC.md, "Layers")."""
    graph = import_graph()
    found = circles(room_graph(graph))
    details = []
    for group in found:
        for module, targets in sorted(graph.items()):
            for target in sorted(targets):
                if (
                    module != "cantrip"
                    and target != "cantrip"
                    and room_of(module) in group
                    and room_of(target) in group
                    and room_of(module) != room_of(target)
                ):
                    details.append(f"{module} -> {target}")
    assert not found, (
        "rooms importing each other: "
        + "; ".join(" <-> ".join(group) for group in found)
        + "\n"
        + "\n".join(details)
    )


def test_the_room_check_finds_an_import_back_up(tmp_path: Path) -> None:
    """The check above can fail: a lazy import from the loom up into a top-level
    module that imports the loom makes two rooms that import each other."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "cantrip" / "loom").mkdir()
    (tmp_path / "cantrip" / "loom" / "__init__.py").write_text("")
    (tmp_path / "cantrip" / "loom" / "_export.py").write_text(
        "def render():\n    from cantrip._context import Context\n"
    )
    (tmp_path / "cantrip" / "_context.py").write_text("from cantrip.loom._model import Turn\n")
    (tmp_path / "cantrip" / "loom" / "_model.py").write_text("Turn = 1\n")
    graph = import_graph(tmp_path)
    assert circles(graph) == []  # no module circle: only the rooms' floors are crossed
    assert circles(room_graph(graph)) == [["cantrip._context", "cantrip.loom"]]


LINE_LIMIT = 800


def test_no_module_is_over_the_line_limit() -> None:
    """A module has one job and a newcomer can hold it: none in the three packages runs
    past 800 lines (the house issue 40 rebuilt had five over it, the entity at 1,736).
    A module nearing the limit is split by role, not trimmed."""
    over = sorted(
        f"{name}: {lines} lines"
        for name, path in module_files().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LINE_LIMIT
    )
    assert over == []


PROTOCOLS = "cantrip.protocols"
PROTOCOL_FLOORS = ("sessions", "asgi", "middleware")
"""The floors of the front ends' room, from the bottom (issue 41): the sessions seam
and its backends know no HTTP; the ASGI primitives may read a session's ids and rules;
the middleware wraps every route; each protocol stands above all three."""


def protocol_package_of(module: str) -> str | None:
    """The package of ``cantrip/protocols/`` a module is in (None: its face, or outside)."""
    parts = module.split(".")
    if module.startswith(PROTOCOLS + ".") and len(parts) > 3:
        return parts[2]
    return None


def protocol_imports_running_down_only(graph: dict[str, set[str]]) -> list[str]:
    """Imports between the packages of ``cantrip/protocols/`` that run down no floor:
    a floor importing one above it, or one protocol importing another (only ``http``,
    which serves them all, mounts the others)."""
    low = PROTOCOL_FLOORS

    def runs_down(mine: str, theirs: str) -> bool:
        if mine in low:
            return theirs in low and low.index(theirs) < low.index(mine)
        return theirs in low or mine == "http"

    wrong = []
    for module, targets in sorted(graph.items()):
        mine = protocol_package_of(module)
        for target in sorted(targets):
            theirs = protocol_package_of(target)
            if mine is None or theirs is None or theirs == mine:
                continue
            if not runs_down(mine, theirs):
                wrong.append(f"{module} -> {target}")
    return wrong


def test_the_protocols_packages_stand_on_floors() -> None:
    """The layout shows the seam: sessions, then the ASGI primitives, then middleware,
    then one package per protocol, each written once over the seam (SPEC.md, the
    rooms table)."""
    assert protocol_imports_running_down_only(import_graph()) == []


def test_the_floor_check_finds_a_session_module_importing_http() -> None:
    graph = {
        "cantrip.protocols.sessions._hub": {"cantrip.protocols.asgi._responses"},
        "cantrip.protocols.a2a._handler": {"cantrip.protocols.agui._run"},
        "cantrip.protocols.http._serve": {"cantrip.protocols.a2a._handler"},
        "cantrip.protocols.middleware._guard": {"cantrip.protocols.asgi._responses"},
    }
    assert protocol_imports_running_down_only(graph) == [
        "cantrip.protocols.a2a._handler -> cantrip.protocols.agui._run",
        "cantrip.protocols.sessions._hub -> cantrip.protocols.asgi._responses",
    ]
