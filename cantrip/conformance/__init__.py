"""The conformance runner for tests.yaml files."""

from cantrip.conformance._cases import CaseResult, load_cases, summarize
from cantrip.conformance._runner import Runner

__all__ = ["CaseResult", "Runner", "load_cases", "summarize"]
