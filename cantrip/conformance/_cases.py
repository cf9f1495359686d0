"""The cases of a tests.yaml file: reading them, and what running one gave.

A file is a YAML list of cases; a case is the keys ``CASE_KEYS`` (any other
fails it, see :mod:`cantrip.conformance._runner`). A case's result says whether
it passed and, when not, why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from cantrip._errors import CantripError

CASE_KEYS = ("rule", "name", "description", "setup", "action", "expect")


@attrs.frozen
class CaseResult:
    rule: str
    name: str
    passed: bool
    message: str = ""

    @property
    def label(self) -> str:
        return f"[{self.rule}] {self.name}"


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CantripError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, list):
        raise CantripError(f"{path}: a tests file is a YAML list of cases")
    return [case for case in data if case is not None]


def summarize(results: Sequence[CaseResult]) -> str:
    passed = sum(1 for r in results if r.passed)
    return f"{passed} passed, {len(results) - passed} failed"
