"""Runs the project's tests.yaml and the reference vectors through the generic runner.

Cases that need a capability a later issue builds are strict xfails naming it:
in our own tests.yaml by a ``# needs: <capability>`` comment above the case,
in the reference file by the table below. A strict xfail that starts passing
fails the suite, so the table must shrink as capabilities land.

The reference vectors live outside the repository (``../shared/reference/tests.yaml``,
beside CI's clone). In an ordinary clone they are absent: their tests are skipped with
a reason that the summary shows, so the README's test command passes anywhere. CI sets
``CANTRIP_REQUIRE_REFERENCE=1`` (``.ci/run``), which turns that skip into a failure: a
green CI run means the vectors ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cantrip.conformance import Runner, load_cases

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "tests.yaml"
REFERENCE = ROOT.parent / "shared" / "reference" / "tests.yaml"
REQUIRE_REFERENCE = "CANTRIP_REQUIRE_REFERENCE"
"""Set (to anything but ``""``/``0``) by CI: an absent reference file fails instead of skipping."""

# Reference cases whose capability is not built yet: (rule, name) -> capability.
REFERENCE_PENDING: dict[tuple[str, str], str] = {}

_NEEDS = re.compile(r"^\s*#\s*needs:\s*([\w-]+)")
_CASE_START = re.compile(r"^-\s+rule:")


def own_pending(path: Path) -> list[str | None]:
    """The ``# needs:`` marker of each case in file order (None when absent)."""
    markers: list[str | None] = []
    pending: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _NEEDS.match(line)
        if match:
            pending = match.group(1)
        elif _CASE_START.match(line):
            markers.append(pending)
            pending = None
        elif line.strip() and not line.lstrip().startswith("#") and pending and line[0] != " ":
            pending = None
    return markers


def reference_required() -> bool:
    """Whether this run must run the reference vectors (CI sets the variable)."""
    return os.environ.get(REQUIRE_REFERENCE, "") not in ("", "0")


def _absent(path: Path, required: bool) -> Any:
    """The one case standing for a missing vector file: a failure when the file is
    required (CI, and always for our own tests.yaml), else a skip whose reason says
    where the file should be and how CI insists on it."""
    if required:
        return pytest.param(None, id="absent")
    reason = (
        f"reference vectors not found at {path} (they sit beside CI's clone; "
        f"{REQUIRE_REFERENCE}=1 makes this a failure)"
    )
    return pytest.param(None, id="absent", marks=pytest.mark.skip(reason=reason))


def _params(
    path: Path, pending: list[str | None] | None = None, *, required: bool = True
) -> list[Any]:
    if not path.exists():
        return [_absent(path, required)]
    cases = load_cases(path)
    params = []
    for index, case in enumerate(cases):
        rule, name = str(case.get("rule")), str(case.get("name"))
        if pending is not None:
            need = pending[index] if index < len(pending) else None
        else:
            need = REFERENCE_PENDING.get((rule, name))
        marks = (
            [pytest.mark.xfail(strict=True, reason=f"needs {need} (a later issue)")] if need else []
        )
        params.append(pytest.param(case, id=f"{index:02d}-{rule}-{name}", marks=marks))
    return params


@pytest.mark.parametrize("case", _params(OWN, own_pending(OWN) if OWN.exists() else []))
def test_own_case(case: dict[str, Any] | None) -> None:
    assert case is not None, f"{OWN} is absent: the project's own vectors did not run"
    result = Runner().run_case(case)
    assert result.passed, result.message


@pytest.mark.parametrize("case", _params(REFERENCE, required=reference_required()))
def test_reference_case(case: dict[str, Any] | None) -> None:
    assert case is not None, (
        f"{REFERENCE} is absent: the reference vectors did not run. They live in the "
        "shared folder beside the repository (../shared/reference/tests.yaml); CI "
        "provides it, so a checkout without it cannot claim conformance."
    )
    result = Runner().run_case(case)
    assert result.passed, result.message


def test_reference_vectors_are_all_listed() -> None:
    """Every pending entry names a case that exists (no stale xfail table)."""
    if not REFERENCE.exists() and not reference_required():
        pytest.skip(f"reference vectors not found at {REFERENCE}")
    assert REFERENCE.exists(), f"{REFERENCE} is absent: the reference vectors did not run"
    names = {(str(c.get("rule")), str(c.get("name"))) for c in load_cases(REFERENCE)}
    assert set(REFERENCE_PENDING) <= names


def test_a_missing_required_vector_file_fails_rather_than_skips(tmp_path: Path) -> None:
    """Required (our own file; the reference under CI): one case, ``None``, no skip mark,
    which the tests above fail on."""
    params = _params(tmp_path / "tests.yaml", required=True)
    assert [p.values for p in params] == [(None,)]
    assert not any(p.marks for p in params)
    with pytest.raises(AssertionError, match="reference vectors did not run"):
        test_reference_case(None)


def test_a_missing_optional_vector_file_skips_with_its_reason(tmp_path: Path) -> None:
    params = _params(tmp_path / "tests.yaml", required=False)
    [param] = params
    [mark] = param.marks
    assert mark.name == "skip"
    assert str(tmp_path / "tests.yaml") in mark.kwargs["reason"]
    assert REQUIRE_REFERENCE in mark.kwargs["reason"]


def _clone_without_reference(tmp_path: Path) -> Path:
    """A copy of what this test module needs, laid out like a clone with no
    ``../shared`` beside it."""
    repo = tmp_path / "clone"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_conformance.py").write_bytes(Path(__file__).read_bytes())
    (repo / "tests.yaml").write_bytes(OWN.read_bytes())
    return repo


def _pytest(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # no plugin autoloading: the module needs none, and loading them all is most of the time
    env = {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "no:xdist", "-rs", "tests/test_conformance.py::test_reference_case",
         "tests/test_conformance.py::test_reference_vectors_are_all_listed"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_clone_without_the_reference_passes_and_says_why(tmp_path: Path) -> None:
    """Issue 30.1: the README's test command passes in an ordinary clone; the skipped
    reference vectors show their reason in the summary."""
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_REFERENCE}
    run = _pytest(_clone_without_reference(tmp_path), env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SKIPPED" in run.stdout and "reference vectors not found" in run.stdout
    assert "failed" not in run.stdout


def test_ci_fails_without_the_reference(tmp_path: Path) -> None:
    """Under CI (``CANTRIP_REQUIRE_REFERENCE=1``) the same clone fails, naming the file."""
    env = {**os.environ, REQUIRE_REFERENCE: "1"}
    run = _pytest(_clone_without_reference(tmp_path), env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the reference vectors did not run" in run.stdout
