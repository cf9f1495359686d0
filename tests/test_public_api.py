"""The package root is the one public API surface (every documented name is there)."""

from __future__ import annotations

import subprocess
import sys

import cantrip


def test_every_public_name_resolves() -> None:
    for name in cantrip.__all__:
        assert getattr(cantrip, name) is not None, name


def test_unknown_names_still_raise_attribute_error() -> None:
    try:
        cantrip.does_not_exist  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "does_not_exist" in str(exc)
    else:
        raise AssertionError("an unknown attribute resolved")


def test_importing_cantrip_loads_no_provider_or_supervision_code() -> None:
    probe = (
        "import sys, cantrip; "
        "print(sorted(m for m in ('httpx', 'cantrip._supervisor', 'cantrip.llm._config', "
        "'mediums.js', 'mediums.python', 'quickjs', 'pydantic_monty') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
