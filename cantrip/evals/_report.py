"""Reports of an eval run: the final table, JUnit XML for CI, and A/B comparison."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from cantrip._errors import CantripError
from cantrip.evals._runner import EvalReport

SCHEMA = "cantrip.eval/1"


def table(report: EvalReport) -> str:
    """The final table: one line per case, then the totals. With ``--repeat K`` two
    columns more: pass@k (any of the K runs passed) and pass^k (all of them did), and
    the share of cases meeting each on the totals line."""
    data = report.to_dict()
    repeated = report.repeat > 1
    k = report.repeat
    head = ("case", "pass", "rate", *((f"pass@{k}", f"pass^{k}") if repeated else ()))
    rows = [(*head, "turns", "tokens", "cost $", "latency s")]
    for case in data["cases"]:
        rows.append(
            (
                case["name"] + (" (flaky)" if case["flaky"] else ""),
                f"{case['passed']}/{case['runs']}",
                f"{case['pass_rate']:.0%}",
                *((_yes(case["pass_at_k"]), _yes(case["pass_all_k"])) if repeated else ()),
                f"{case['turns']['mean']:g}",
                f"{case['tokens']['mean']:g}",
                "?" if case["cost_unknown"] else f"{case['cost_usd']['mean']:.6f}",
                f"{case['latency_s']['mean']:.3f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    s = data["summary"]
    cost = f"${s['cost_usd']:.6f}" + (" + unknown" if s["cost_unknown"] else "")
    lines.append(
        f"{s['passed']} passed, {s['failed']} failed, {s['errored']} errored, "
        f"{s['skipped']} skipped of {s['runs']} runs; cost {cost}"
        + (f" (judges ${s['judge_cost_usd']:.6f})" if s["judge_cost_usd"] else "")
        + f"; {data['duration_s']:.2f} s"
    )
    if repeated and data["cases"]:
        cases = data["cases"]
        at_k = sum(c["pass_at_k"] for c in cases) / len(cases)
        all_k = sum(c["pass_all_k"] for c in cases) / len(cases)
        lines.append(
            f"pass@{k} {at_k:.0%} of cases (any run passed); pass^{k} {all_k:.0%} (all did)"
        )
    return "\n".join(lines)


def _yes(value: float) -> str:
    return "yes" if value else "no"


def failure_lines(report: EvalReport) -> list[str]:
    """One line per run that did not pass, saying why."""
    out = []
    for run in report.runs:
        if run.status == "passed":
            continue
        label = run.case if report.repeat == 1 else f"{run.case} #{run.repeat + 1}"
        out.append(f"{run.status.upper()} {label}: {run.why}")
    return out


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""A character XML 1.0 cannot carry, not even as a character reference: the C0
controls but tab, newline and carriage return, lone surrogates, U+FFFE and U+FFFF."""


def _xml_safe(text: str) -> str:
    """``text`` with each character XML 1.0 forbids written as a visible escape
    (``\\x1b``, ``\\ud800``); every other character is kept as it was.

    A case name or an agent's answer may hold anything (an ANSI colour's ESC, a NUL,
    a surrogate from a bad decode); written raw, one of them makes the whole JUnit
    file unreadable to CI (and a surrogate cannot even be encoded to UTF-8)."""
    return _NOT_XML.sub(_escape_char, text)


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def junit_xml(report: EvalReport) -> str:
    """JUnit XML: one test case per run, failures and errors with their reasons; every
    name and text made safe for XML 1.0 (:func:`_xml_safe`)."""
    data = report.to_dict()["summary"]
    suite = ET.Element(
        "testsuite",
        name=_xml_safe(report.suite),
        tests=str(data["runs"]),
        failures=str(data["failed"]),
        errors=str(data["errored"]),
        skipped=str(data["skipped"]),
        time=f"{report.duration_s:.3f}",
    )
    for run in report.runs:
        name = _xml_safe(run.case if report.repeat == 1 else f"{run.case} [{run.repeat + 1}]")
        why = _xml_safe(run.why)
        case = ET.SubElement(
            suite, "testcase", classname="cantrip.eval", name=name, time=f"{run.latency_s:.3f}"
        )
        if run.status == "failed":
            ET.SubElement(case, "failure", message=why[:500]).text = why
        elif run.status == "errored":
            ET.SubElement(case, "error", message=why[:500]).text = why
        elif run.status == "skipped":
            ET.SubElement(case, "skipped", message=why[:500])
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def read_report(path: str | Path) -> dict[str, Any]:
    """A JSON report written by ``cantrip eval --json`` (checked for its schema)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CantripError(f"{path}: no such report") from None
    except (OSError, ValueError) as exc:
        raise CantripError(f"{path}: not a JSON eval report ({exc})") from None
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise CantripError(f"{path}: not a cantrip eval report (schema {SCHEMA} expected)")
    return dict(data)


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Per-case regressions and improvements from report ``a`` to report ``b``, and the
    deltas in pass rate, cost, tokens and latency (means per run)."""
    cases_a = {c["name"]: c for c in a["cases"]}
    cases_b = {c["name"]: c for c in b["cases"]}
    rows = []
    for name in [*cases_a, *(n for n in cases_b if n not in cases_a)]:
        ca, cb = cases_a.get(name), cases_b.get(name)
        if ca is None or cb is None:
            rows.append({"name": name, "change": "only in A" if cb is None else "only in B"})
            continue
        delta = cb["pass_rate"] - ca["pass_rate"]
        change = "regression" if delta < 0 else "improvement" if delta > 0 else "same"
        rows.append(
            {
                "name": name,
                "change": change,
                "pass_rate": [ca["pass_rate"], cb["pass_rate"]],
                "cost_usd": _delta(ca["cost_usd"]["mean"], cb["cost_usd"]["mean"]),
                "tokens": _delta(ca["tokens"]["mean"], cb["tokens"]["mean"]),
                "latency_s": _delta(ca["latency_s"]["mean"], cb["latency_s"]["mean"]),
            }
        )
    sa, sb = a["summary"], b["summary"]
    return {
        "cases": rows,
        "regressions": [r["name"] for r in rows if r["change"] == "regression"],
        "improvements": [r["name"] for r in rows if r["change"] == "improvement"],
        "pass_rate": _delta(sa["pass_rate"], sb["pass_rate"]),
        "cost_usd": _delta(sa["cost_usd"], sb["cost_usd"]),
        "tokens": _delta(sa["tokens"], sb["tokens"]),
    }


def _delta(a: float, b: float) -> dict[str, float]:
    return {"a": a, "b": b, "delta": round(b - a, 10)}


def compare_text(result: Mapping[str, Any]) -> str:
    lines = []
    for row in result["cases"]:
        if "pass_rate" not in row:
            lines.append(f"{row['name']}: {row['change']}")
            continue
        ra, rb = row["pass_rate"]
        lines.append(
            f"{row['name']}: {row['change']} (pass {ra:.0%} -> {rb:.0%}; "
            f"cost {row['cost_usd']['delta']:+.6f} $, tokens {row['tokens']['delta']:+g}, "
            f"latency {row['latency_s']['delta']:+.3f} s)"
        )
    pr = result["pass_rate"]
    lines.append(
        f"overall: pass rate {pr['a']:.0%} -> {pr['b']:.0%}; "
        f"{len(result['regressions'])} regressions, {len(result['improvements'])} improvements; "
        f"cost {result['cost_usd']['delta']:+.6f} $, tokens {result['tokens']['delta']:+g}"
    )
    return "\n".join(lines)
