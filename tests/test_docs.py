"""The documentation runs as written: every code block of README.md and docs/ (issue 30.10).

A small collector of fenced blocks instead of a plugin, because the blocks are of
several kinds and each is checked for what it is:

- ``python``: run in a fresh, empty folder (a guide writes the examples it needs with
  ``cantrip init``, as a user of the installed package does); when the block is
  followed by ``<!-- output -->`` and a ``text`` block, what it prints must be that;
- ``console``: each ``$ command`` runs there with the ``cantrip`` of this environment on
  ``PATH``; the lines after it are its stdout, where a line ``...`` stands for any lines
  and ``...`` inside a line for any text (timings), and a last line ``[exit N]`` expects
  that exit code (else 0);
- ``bash``/``sh``: the block runs as one script (``set -euo pipefail``);
- ``toml``: parsed; a whole spec (``[llm]`` and ``[circle]``) is also built, as
  ``cantrip cast`` would build it;
- ``json`` and ``yaml``: parsed.

A block that needs the network, a real key or a server that is not started here is
preceded by ``<!-- not run: REASON -->``: it is checked for syntax only (Python
compiled, shell ``bash -n``, TOML and JSON parsed). Those blocks are listed by
``test_blocks_that_do_not_run_are_few_and_say_why``; keep the list short.

The site itself is built with ``mkdocs build --strict`` (broken links, missing pages
and docstring warnings fail it), and the generated reference pages are checked.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")
OUTPUT = re.compile(r"\A\s*<!-- output -->\s*```text\n(.*?)^```", re.S | re.M)
CHECKED = ("python", "console", "bash", "sh", "toml", "json", "yaml")
MOST_NOT_RUN = 18
"""The cap on blocks that only get a syntax check: raise it only with a reason."""


@dataclass(frozen=True)
class Block:
    source: Path
    line: int
    lang: str
    code: str
    not_run: str | None
    output: str | None

    @property
    def id(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}-{self.lang}"


def blocks() -> list[Block]:
    found = []
    for source in SOURCES:
        text = source.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            lang = match.group(1)
            if lang not in CHECKED:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = NOT_RUN.search(before)
            after = OUTPUT.match(text, match.end())
            found.append(
                Block(
                    source=source,
                    line=text.count("\n", 0, match.start()) + 1,
                    lang=lang,
                    code=match.group(2),
                    not_run=marker.group(1) if marker else None,
                    output=after.group(1) if after else None,
                )
            )
    return found


BLOCKS = blocks()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder, as a user of the installed package starts from (issue 47.3):
    a guide that needs an example writes it with ``cantrip init``. Only cantrip's own
    conformance vectors (the conformance page runs them) are put there."""
    shutil.copy(ROOT / "tests.yaml", tmp_path / "tests.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", _env()["PATH"])  # a python block runs `cantrip` too
    return tmp_path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("CANTRIP_DEBUG", None)
    return env


def _matches(out: str, expected: list[str]) -> bool:
    """``out`` against the expected lines: ``...`` alone is any lines, inside a line any text."""
    pattern = "".join(
        r"(?:.*\n)*"
        if line.strip() == "..."
        else ".*?".join(map(re.escape, line.split("..."))) + r"\n"
        for line in expected
    )
    text = out.strip() + "\n" if out.strip() else ""
    return re.fullmatch(pattern, text) is not None


def _console(code: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console output before any command: {line!r}")
    return steps


# capfd, not capsys: a block that starts a process (an MCP client over stdio) needs real
# file descriptors for its standard streams.
@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.not_run], ids=lambda b: b.id)
def test_block_runs(block: Block, workdir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    where = f"{block.id} does not run as written"
    if block.lang == "python":
        script = workdir / "example.py"
        script.write_text(block.code, encoding="utf-8")
        runpy.run_path(str(script), run_name="__main__")
        if block.output is not None:
            assert capfd.readouterr().out.strip() == block.output.strip(), where
    elif block.lang == "console":
        for command, expected in _console(block.code):
            code = 0
            if expected and re.fullmatch(r"\[exit \d+\]", expected[-1]):
                code = int(expected.pop()[6:-1])
            run = subprocess.run(
                ["bash", "-c", command], cwd=workdir, env=_env(), capture_output=True,
                text=True, timeout=120,
            )  # fmt: skip
            assert run.returncode == code, f"{where}: `{command}` exited {run.returncode}\n{run}"
            assert _matches(run.stdout, expected), f"{where}: `{command}` printed\n{run.stdout}"
    elif block.lang in ("bash", "sh"):
        run = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + block.code], cwd=workdir, env=_env(),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, f"{where}:\n{run.stdout}\n{run.stderr}"
    elif block.lang == "yaml":
        yaml.safe_load(block.code)
    elif block.lang == "toml":
        data = tomllib.loads(block.code)
        if "llm" in data and "circle" in data:
            from cantrip.spec import build_cantrip, parse_spec

            build_cantrip(parse_spec(data), base_dir=workdir).loom.close()
    else:
        json.loads(block.code)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run], ids=lambda b: b.id)
def test_block_not_run_is_valid_syntax(block: Block) -> None:
    if block.lang == "python":
        compile(block.code, block.id, "exec")
    elif block.lang in ("bash", "sh", "console"):
        code = (
            "\n".join(c for c, _ in _console(block.code)) if block.lang == "console" else block.code
        )
        run = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    elif block.lang == "toml":
        tomllib.loads(block.code)
    elif block.lang == "yaml":
        yaml.safe_load(block.code)
    else:
        json.loads(block.code)


def test_blocks_that_do_not_run_are_few_and_say_why() -> None:
    skipped = [f"{b.id}: {b.not_run}" for b in BLOCKS if b.not_run]
    print("\n".join(skipped))
    assert len(skipped) <= MOST_NOT_RUN, "\n".join(skipped)
    assert all(b.not_run and len(b.not_run) > 10 for b in BLOCKS if b.not_run)


GLOSSARY = (
    "In other frameworks' words: **gate** = tool, **ward** = limit, **loom** = run "
    "record, **entity** = a running agent, **circle** = tools + sandbox + limits."
)


def test_the_readme_and_the_tutorial_open_with_the_one_line_glossary() -> None:
    """A newcomer meets cantrip's words beside the ones they know (issue 47.5)."""
    for page in (ROOT / "README.md", ROOT / "docs" / "tutorial" / "python.md"):
        opening = page.read_text(encoding="utf-8").split("\n\n")[:3]
        assert GLOSSARY in opening, page


def test_every_page_has_blocks_and_the_readme_has_its_quick_start() -> None:
    langs = {b.lang for b in BLOCKS if b.source.name == "README.md" and not b.not_run}
    assert {"python", "console"} <= langs
    assert len([b for b in BLOCKS if not b.not_run]) >= 25


def test_a_workflow_publishes_the_site_as_strictly_as_the_tests_build_it() -> None:
    """GitHub Pages gets the site on every push to main, built with ``--strict`` (issue
    47.5); the README says where."""
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "docs.yml").read_text())
    build = [step.get("run", "") for step in flow["jobs"]["build"]["steps"]]
    assert any(run.startswith("mkdocs build --strict") for run in build)
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact") for s in
               flow["jobs"]["build"]["steps"])  # fmt: skip
    assert flow["jobs"]["deploy"]["steps"][0]["uses"].startswith("actions/deploy-pages")
    assert flow[True]["push"]["branches"] == ["main"]  # YAML 1.1 reads `on:` as true
    assert ".github/workflows/docs.yml" in (ROOT / "README.md").read_text()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: no broken link, no missing page, no warning."""
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env={**_env(), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    assert not [name for name, html in pages.items() if "<!-- generated:" in html]
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    linked = re.findall(r'href="([\w./-]+/)"', pages["index.html"])
    guides = [path[:-3] + "/" for section in nav if isinstance(section, dict)
              for pages_ in section.values() if isinstance(pages_, list)
              for page in pages_ for path in page.values()]  # fmt: skip
    assert guides and not [g for g in guides if g not in linked]  # issue 47.5
    from cantrip.protocols.asgi._openapi import openapi_document

    published = json.loads((site / "reference" / "openapi.json").read_text())
    assert published == json.loads(json.dumps(openapi_document()))
    cli = pages["reference/cli/index.html"]
    for command in ("cantrip loom export", "cantrip serve", "cantrip init", "--max-body"):
        assert command in cli
    http = pages["reference/http/index.html"]
    assert "/sessions/{session_id}/prompt" in http and "PromptRequest" in http
    api = pages["reference/api/index.html"]
    import cantrip

    missing = [name for name in cantrip.__all__ if f'id="cantrip.{name}"' not in api]
    assert not missing, f"public names missing from the API reference: {missing}"
    dunders = re.findall(r'id="cantrip\.[\w.]*\.__\w+__"', api)
    assert not dunders, f"dunder members on the API page: {dunders}"  # issue 47.5
    said_once = "modules whose names start with an underscore are private"
    words = " ".join(re.sub(r"<[^>]+>", " ", api).split())
    assert words.count(said_once) == 1, "the package docstring is repeated on the API page"
    roles = re.findall(r":(?:class|func|meth|attr|data|mod):<code>", api)
    assert not roles, f"reST roles shown literally on the API page: {len(roles)}"
    # the site renders offline (issue 47.5): no page loads a script, a stylesheet, a font
    # or a picture from another host, and the concepts pictures are committed files
    remote = re.compile(r"<(?:script|img|link)\b[^>]*?(?:src|href)=\"(?:https?:)?//[^\"]+\"")
    loads = {name: remote.findall(html) for name, html in pages.items()}
    assert not {name: found for name, found in loads.items() if found}
    assert 'class="mermaid"' not in "".join(pages.values())
    concepts = pages["concepts/index.html"]
    for picture in ("concepts-cast.svg", "concepts-layers.svg"):
        assert f"img/{picture}" in concepts and (site / "img" / picture).stat().st_size > 1000


def test_the_table_of_modes_is_what_the_backends_capabilities_render() -> None:
    """The docs' table of what each ``cantrip serve`` mode offers is generated from the
    backends' :class:`~cantrip.protocols.sessions.Capabilities` (issue 41): the page
    holds exactly what :func:`~cantrip.protocols.sessions.modes_table` renders, so it
    cannot drift from the one place a mode says what it lacks. To refresh it, paste
    ``python -c "from cantrip.protocols.sessions import modes_table; print(modes_table())"``
    between the markers."""
    from cantrip.protocols.sessions import MODES_MARKERS, MODES_PAGE, modes_table

    page = (ROOT / MODES_PAGE).read_text()
    start, end = MODES_MARKERS
    assert page.count(start) == 1 and page.count(end) == 1, f"{MODES_PAGE} lacks the markers"
    shown = page.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"
    assert shown == modes_table(), f"regenerate the table of modes in {MODES_PAGE}"


def test_test_double_keys_are_on_their_own_page_not_among_the_users_keys() -> None:
    """The spec reference lists the keys users write; the fixture gates' keys are
    documented apart as test doubles (issue 47.1)."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    from cantrip.spec._tables import GateSpec

    doubles = [
        name
        for name, field in GateSpec.model_fields.items()
        if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("test_double")
    ]
    assert set(doubles) == {"behavior", "result", "error", "delay_ms", "stateful"}
    reference = hooks.spec_markdown()
    gate_table = reference[reference.index("### `[circle].gates`") :]
    gate_table = gate_table[: gate_table.index("\n###", 5)]
    page = (ROOT / "docs" / "reference" / "test-doubles.md").read_text()
    for key in doubles:
        assert f"| `{key}` |" not in gate_table
        assert f"| `{key}` |" in page
    assert "| `import` |" in gate_table
