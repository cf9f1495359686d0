"""``cantrip init``: write an example that ships inside the package.

An installed wheel has no ``examples/`` folder, so the guides' commands need their
files from somewhere: every example lives in the package (``cantrip/examples/``,
package data; a clone's ``examples/`` links to the same files) and this writes one
into a folder. ``cantrip init`` alone writes ``hello.toml``, which runs offline with a
scripted LLM and says which lines to change for a real provider.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, NamedTuple

DEFAULT_NAME = "hello.toml"


class Example(NamedTuple):
    """An example: what it shows, its files (as shipped -> as written), what to run."""

    about: str
    files: tuple[tuple[str, str], ...]
    then: str


def _provider(name: str, model: str) -> Example:
    file = f"{name.replace('-', '_')}.toml"
    return Example(
        f"a real model: {model} (needs its API key or server)",
        ((f"providers/{file}", file),),
        f'cantrip cast {file} "Echo hello, then finish."',
    )


EXAMPLES: dict[str, Example] = {
    "hello": Example(
        "the first cantrip: a scripted LLM (no key), two gates, a turn limit",
        (("hello.toml", "hello.toml"),),
        'cantrip cast hello.toml "Greet the world, then finish."',
    ),
    "read-files": Example(
        "a read gate confined to a folder; a missing file is an observation",
        (("read_files.toml", "read_files.toml"), ("data/notes.txt", "data/notes.txt")),
        'cantrip cast read_files.toml "Summarise the notes."',
    ),
    "evals": Example(
        "an eval suite with its recording: runs offline with --replay",
        (
            ("hello.toml", "hello.toml"),
            ("evals/hello.yaml", "evals/hello.yaml"),
            ("evals/hello.recording.jsonl", "evals/hello.recording.jsonl"),
        ),
        "cantrip eval evals/hello.yaml --replay",
    ),
    "memory": Example(
        "memory across sessions: a cross-session eval, memory on and off (--replay: no key)",
        (
            ("memory.toml", "memory.toml"),
            ("memory_off.toml", "memory_off.toml"),
            ("evals/memory.yaml", "evals/memory.yaml"),
            ("evals/memory.recording.jsonl", "evals/memory.recording.jsonl"),
        ),
        "cantrip eval evals/memory.yaml --replay   (then --spec memory_off.toml)",
    ),
    "slow": Example(
        "a model that takes its time: for steering, double-texting, cancel, approvals",
        (("slow.toml", "slow.toml"),),
        "cantrip serve slow.toml --port 8765   (then the steering guide's recipe)",
    ),
    "openai": _provider("openai", "OpenAI Chat Completions"),
    "openai-responses": _provider("openai-responses", "OpenAI Responses API"),
    "anthropic": Example(
        "a real model: Anthropic (needs ANTHROPIC_API_KEY)",
        (("providers/anthropic.toml", "anthropic.toml"),),
        'cantrip cast anthropic.toml "List the files and summarise them."',
    ),
    "gemini": _provider("gemini", "Google Gemini"),
    "openrouter": _provider("openrouter", "OpenRouter"),
    "ollama": _provider("ollama", "a local Ollama server"),
}


def shipped(name: str) -> Traversable:
    """A file of the shipped examples, by its path under ``cantrip/examples``."""
    node = resources.files("cantrip").joinpath("examples")
    for part in name.split("/"):
        node = node.joinpath(part)
    return node


def add_init_parser(
    commands: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Add ``init`` to a ``cantrip`` parser."""
    init: argparse.ArgumentParser = commands.add_parser(
        "init",
        parents=list(parents),
        help="write an example that ships with cantrip (hello.toml by default; --list)",
    )
    init.add_argument(
        "target",
        nargs="?",
        help=f"an example's name (see --list), or where to write {DEFAULT_NAME}: a file, "
        f"or a folder to write it into (default: ./{DEFAULT_NAME})",
    )
    init.add_argument(
        "folder",
        nargs="?",
        type=Path,
        help="with an example's name: the folder to write it into (default: .)",
    )
    init.add_argument("--list", action="store_true", help="list the examples and exit")
    init.add_argument("--force", action="store_true", help="overwrite existing files")
    return init


def run_init(args: argparse.Namespace) -> int:
    """Write an example; existing files are left alone unless ``--force``."""
    if args.list:
        width = max(map(len, EXAMPLES))
        for name, example in EXAMPLES.items():
            print(f"{name.ljust(width)}  {example.about}")
        return 0
    target: str | None = args.target
    if target in EXAMPLES:
        example = EXAMPLES[target]
        folder: Path = args.folder or Path(".")
        plan = [(source, folder / written) for source, written in example.files]
    elif args.folder is not None:
        return _fail(f"no example named {target!r} (cantrip init --list shows them)")
    else:
        example = EXAMPLES["hello"]
        path = Path(target) if target else Path(DEFAULT_NAME)
        plan = [("hello.toml", path / DEFAULT_NAME if path.is_dir() else path)]
    clashes = [str(path) for _, path in plan if path.exists()]
    if clashes and not args.force:
        verb = "exists" if len(clashes) == 1 else "exist"
        return _fail(f"{', '.join(clashes)} {verb}; --force overwrites")
    for source, path in plan:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(shipped(source).read_bytes())
        except OSError as exc:
            return _fail(f"cannot write {path}: {exc.strerror or exc}")
    written = " ".join(str(path) for _, path in plan)
    then = example.then
    if target is not None and target not in EXAMPLES:  # hello.toml under another name
        then = then.replace("hello.toml", str(plan[0][1]))
    elif args.folder is not None:
        then = f"cd {args.folder} && {then}"
    print(f"cantrip: wrote {written}; try: {then}", file=sys.stderr)
    return 0


def _fail(message: str) -> int:
    print(f"cantrip: {message}", file=sys.stderr)
    return 1
