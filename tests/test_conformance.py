"""Runs the project's tests.yaml and the reference vectors through the generic runner.

Cases that need a capability a later issue builds are strict xfails naming it:
in our own tests.yaml by a ``# needs: <capability>`` comment above the case,
in the reference file by the table below. A strict xfail that starts passing
fails the suite, so the table must shrink as capabilities land.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cantrip.conformance import Runner, load_cases

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "tests.yaml"
REFERENCE = ROOT.parent / "shared" / "reference" / "tests.yaml"

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


def _params(path: Path, pending: list[str | None] | None = None) -> list[Any]:
    if not path.exists():
        # A missing file is a failure, never a skip: a green suite must mean the
        # vectors ran (the reference copy is not ours to vendor, see SPEC.md).
        return [pytest.param(None, id="absent")]
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


@pytest.mark.parametrize("case", _params(REFERENCE))
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
    assert REFERENCE.exists(), f"{REFERENCE} is absent: the reference vectors did not run"
    names = {(str(c.get("rule")), str(c.get("name"))) for c in load_cases(REFERENCE)}
    assert set(REFERENCE_PENDING) <= names


def test_a_missing_vector_file_fails_rather_than_skips(tmp_path: Path) -> None:
    """Without the file there is one case, ``None``, which the tests above fail on."""
    params = _params(tmp_path / "tests.yaml")
    assert [p.values for p in params] == [(None,)]
    assert not any(p.marks for p in params)
    with pytest.raises(AssertionError, match="reference vectors did not run"):
        test_reference_case(None)
