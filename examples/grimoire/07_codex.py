"""A.7 Codex -- a code medium with gates that touch the real world.

    python examples/grimoire/07_codex.py

What to notice: the entity works in Python (a sandboxed interpreter: its
gates are the only way out) with real filesystem gates confined to one
folder. It starts from a wrong guess, hits an error, and adapts -- error as
steering (CIRCLE-5). Later turns build on variables from earlier ones; the
last program looks nothing like the first.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import GateError
from gates import done
from mediums import PythonMedium

# A small project to work on, in a folder of its own.
ROOT = Path(tempfile.mkdtemp(prefix="codex-"))
(ROOT / "src").mkdir()
(ROOT / "out").mkdir()
(ROOT / "src" / "app.py").write_text("def main():\n    # TODO: parse arguments\n    run()\n")
(ROOT / "src" / "db.py").write_text("# TODO: close connections\n# TODO: retry on timeout\n")
(ROOT / "src" / "util.py").write_text("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n")


def _inside(root: Path, path: str) -> Path:
    target = (root / path).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise GateError(f"{path} is outside the project")
    return target


# Gates with their root bound at construction (CIRCLE-10): the entity names
# paths; it cannot choose where the root is.
@cantrip.gate(dependencies=("root",))
def list_dir(path: str, root: Path) -> list[str]:
    """List the entries of a folder of the project."""
    target = _inside(root, path)
    if not target.is_dir():
        raise GateError(f"no folder {path}")
    return sorted(p.name for p in target.iterdir())


@cantrip.gate(dependencies=("root",))
def read(path: str, root: Path) -> str:
    """Read a text file of the project."""
    target = _inside(root, path)
    if not target.is_file():
        raise GateError(f"no file {path}")
    return target.read_text()


@cantrip.gate(dependencies=("root",))
def write(path: str, text: str, root: Path) -> str:
    """Write a text file of the project (replacing it)."""
    _inside(root, path).write_text(text)
    return f"wrote {len(text)} characters to {path}"


SCRIPT = [
    # a guess: the sources are in "source/" -- they are not
    {"code": "files = list_dir('source')"},
    # the error said so; look at what is there
    {"code": "top = list_dir('.')\ntop"},
    # read every file below src/, keep the TODO lines
    {
        "code": "todos = {}\n"
        "for name in list_dir('src'):\n"
        "    lines = read('src/' + name).splitlines()\n"
        "    found = [line.strip().lstrip('# ') for line in lines if 'TODO' in line]\n"
        "    if found:\n"
        "        todos[name] = found\n"
        "todos"
    },
    # write the summary, reusing `todos` from the turn before
    {
        "code": "report = '# TODOs\\n'\n"
        "for name, items in todos.items():\n"
        "    for item in items:\n"
        "        report += f'- {name}: {item}\\n'\n"
        "print(write('out/todos.md', report))\n"
        "done(f'{sum(len(v) for v in todos.values())} TODOs in {len(todos)} files, "
        "summary in out/todos.md')"
    },
]

spell = cantrip.Cantrip(
    llm=choose_llm(SCRIPT),
    identity=cantrip.Identity(
        system_prompt="You are a careful engineer working in Python. Explore before you "
        "assume; when a gate fails, read the error and change course. Finish with done(...)."
    ),
    circle=cantrip.Circle(
        gates=[list_dir.bind(root=ROOT), read.bind(root=ROOT), write.bind(root=ROOT), done],
        wards=[cantrip.max_turns(12)],
        medium=PythonMedium(),
    ),
)
outcome = spell.cast("Find all TODO comments in src/ and write a summary to out/todos.md")

print("result:", outcome.result)
summary = ROOT / "out" / "todos.md"
print("out/todos.md:\n" + (summary.read_text() if summary.exists() else "(not written)"))
print_loom(spell.loom)
