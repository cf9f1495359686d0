"""The conformance runner for tests.yaml files."""

from cantrip.conformance._runner import CaseResult, Runner, load_cases, summarize

__all__ = ["CaseResult", "Runner", "load_cases", "summarize"]
