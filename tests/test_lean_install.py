"""A lean install (issue 47.2): the core installs what it needs, every other feature is
an extra, and a missing extra is one line naming it.

The core's tests run in an environment that holds the core's distributions and nothing
else (tests/core_env.py: links to this environment's copies, no download), with this
checkout on its path; the built wheel is run the same way by tests/test_wheel.py.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import core_env
import pytest
from packaging.utils import canonicalize_name

from cantrip._install import EXTRAS, MissingExtraError, require_extra

ROOT = Path(__file__).resolve().parents[1]
HELLO = "Greet the world, then finish."

# What used to come with every install and now comes only with an extra.
EXTRA_ONLY = {
    "mcp",
    "mcp-types",
    "httpx2",
    "ag-ui-protocol",
    "hypercorn",
    "quickjs-ng",
    "pydantic-monty",
    "cryptography",
    "jsonschema",
    "google-re2",
    "sqlite-vec",
    "starlette",
    "psycopg",
    "opentelemetry-api",
}

# The modules that import an extra's package at their top: each is imported only by
# code that called require_extra first (or by another of them).
OPTIONAL_MODULES = {
    "cantrip.protocols.agui._input": "ag_ui",
    "cantrip.protocols.agui._protocol": "ag_ui",
    "cantrip.protocols.agui._run": "ag_ui",
    "cantrip.protocols.agui._translate": "ag_ui",
    "cantrip.protocols.agui._waiting": "ag_ui",
    "mediums._js_worker": "quickjs",
    "mediums._python_sandbox": "pydantic_monty",
    "mediums._python_values": "pydantic_monty",
    "mediums.python": "pydantic_monty",
    "cantrip.testing": "pytest",  # the helpers for a user's own tests
}


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of an environment with the core's dependencies only."""
    return core_env.make(tmp_path_factory.mktemp("core") / "venv")


def _cantrip(
    python: Path, *args: str, cwd: Path, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "cantrip", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_core_installs_none_of_the_extras_packages() -> None:
    core = set(core_env.closure())
    everything = set(core_env.closure(("all",)))
    assert not core & EXTRA_ONLY, sorted(core & EXTRA_ONLY)
    assert everything >= EXTRA_ONLY, sorted(EXTRA_ONLY - everything)
    # 55 packages came with every install before (issue 47.2): the core is under half
    assert len(core) < 30, sorted(core)
    assert len(everything) > 2 * len(core)


def test_the_extras_table_is_pyprojects() -> None:
    """Every extra require_extra knows is in pyproject.toml, and each module it looks for
    comes with that extra and not with the core; every runtime extra of pyproject.toml
    is known (docs and dev are tools, all is the union)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(project["optional-dependencies"]) - {"docs", "dev", "all"}
    assert set(EXTRAS) == declared
    core = set(core_env.closure())
    providers = metadata.packages_distributions()
    for extra, modules in EXTRAS.items():
        brought = set(core_env.closure((extra,))) - core
        for module in modules:
            dists = {canonicalize_name(d) for d in providers[module.split(".")[0]]}
            assert dists & brought, (extra, module, sorted(brought))
    everything = set(core_env.closure(("all",)))
    for extra in declared:
        assert set(core_env.closure((extra,))) <= everything, extra


def test_dev_installs_every_extra() -> None:
    assert set(core_env.closure(("all",))) <= set(core_env.closure(("dev",)))


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXTRAS, "js", ("no_such_module_anywhere",))
    with pytest.raises(MissingExtraError) as caught:
        require_extra("js", "the js medium")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the js medium needs the 'js' extra: pip install ")
    assert message.endswith("[js]'")
    assert isinstance(caught.value, ImportError)


@pytest.mark.timeout(600)
def test_hello_world_runs_with_only_the_core(core: Path, tmp_path: Path) -> None:
    """init, cast, invoke, loom list and an eval replay: with nothing but the core."""
    assert _cantrip(core, "init", cwd=tmp_path).returncode == 0
    done = _cantrip(core, "cast", "hello.toml", HELLO, "--loom", "hello.db", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "I greeted the world."), done.stderr
    listed = _cantrip(core, "loom", "hello.db", "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    invoked = _cantrip(core, "invoke", "hello.toml", cwd=tmp_path, stdin=HELLO + "\n")
    assert invoked.returncode == 0, invoked.stderr
    assert "I greeted the world." in invoked.stdout
    assert _cantrip(core, "init", "evals", "--force", cwd=tmp_path).returncode == 0
    replayed = _cantrip(core, "eval", "evals/hello.yaml", "--replay", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "2 passed, 0 failed" in replayed.stdout
    # nothing of an extra was imported on the way (they are not even there)
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('mcp', 'quickjs', 'hypercorn', 'ag_ui', 're2', 'psycopg',"
        " 'opentelemetry', 'pydantic_monty', 'jsonschema') if u.find_spec(m)])"
    )
    assert (
        subprocess.run(
            [str(core), "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )


@pytest.mark.parametrize(
    ("args", "extra", "feature"),
    [
        (("serve", "hello.toml"), "serve", "cantrip serve"),
        (("mcp", "hello.toml"), "mcp", "cantrip mcp"),
        (("loom", "hello.db", "view"), "serve", "cantrip loom view"),
        (("cast", "hello.toml", HELLO, "--otlp", "http://127.0.0.1:9/v1/traces"), "otel", "--otlp"),
        (("worker", "--db", "postgresql://127.0.0.1:9/none"), "postgres", "a postgresql:// loom"),
    ],
)
def test_a_command_whose_extra_is_missing_says_so_in_one_line(
    core: Path, tmp_path: Path, args: tuple[str, ...], extra: str, feature: str
) -> None:
    assert _cantrip(core, "init", cwd=tmp_path).returncode == 0
    assert (
        _cantrip(core, "cast", "hello.toml", HELLO, "--loom", "hello.db", cwd=tmp_path).returncode
        == 0
    )
    done = _cantrip(core, *args, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        f"cantrip: {feature} needs the '{extra}' extra: pip install 'cantrip-runtime[{extra}]'\n"
    )


def test_a_spec_naming_features_whose_extras_are_missing_says_so_at_load(
    core: Path, tmp_path: Path
) -> None:
    """Every missing extra is one problem among the spec's others, before anything runs."""
    (tmp_path / "spec.toml").write_text(
        """
[llm]
provider = "scripted"
responses = [{ code = "done('x')" }]

[circle]
medium = "js"
gates = ["done"]
wards = [{ max_turns = 3 }]

[[circle.mcp]]
name = "time"
command = "mcp-server-time"

[[circle.guardrails]]
check = "regex"
pattern = "secret"
"""
    )
    done = _cantrip(core, "cast", "spec.toml", "--check", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0].startswith("cantrip: 3 problems"), done.stderr
    hint = "needs the '{0}' extra: pip install 'cantrip-runtime[{0}]'"
    assert lines[1] == "  - the js medium " + hint.format("js")
    assert lines[2] == "  - MCP server 'time' " + hint.format("mcp")
    assert lines[3].endswith("(an RE2 pattern) " + hint.format("guardrails"))
    assert "Traceback" not in done.stderr


def test_only_the_optional_modules_need_an_extra(core: Path, tmp_path: Path) -> None:
    """Import every module of the three packages with only the core installed: the
    ones that fail are the optional modules, each for its extra's package -- no core
    module imports an optional package at its top."""
    scan = """
import importlib, pkgutil
for pkg in ("cantrip", "gates", "mediums"):
    for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            print(info.name, exc.name)
"""
    done = subprocess.run(
        [str(core), "-c", scan], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    failed = dict(line.split() for line in done.stdout.splitlines())
    assert failed == OPTIONAL_MODULES


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_only_the_command_line(flag: str, tmp_path: Path) -> None:
    """``cantrip --version``/``--help`` build the parser and nothing else: no runtime,
    no trio, httpx, pydantic or rich."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cantrip", flag],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    heavy = {"trio", "httpx", "pydantic", "attrs", "rich", "orjson", "yaml"}
    heavy |= {"cantrip._cantrip", "cantrip.spec", "cantrip.loom", "cantrip.llm", "gates"}
    assert not imported & heavy, sorted(imported & heavy)
