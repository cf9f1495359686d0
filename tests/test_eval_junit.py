"""``--junit`` always writes well-formed XML 1.0 (issue 39, item 11).

A case name, a suite name or a failure's text can hold any character a model or
a user wrote -- an ANSI colour's ESC, a NUL, a lone surrogate from a bad decode,
U+FFFE. XML 1.0 cannot carry those at all (not even as character references), so
the report writes each as a visible escape (``\\x1b``) and keeps every other
character as it was. Each test parses the file with strict parsers (expat through
``xml.etree`` and ``xml.dom.minidom``), which refuse a document with any of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.dom import minidom
from xml.etree import ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from cantrip.evals import junit_xml
from cantrip.evals._runner import EvalReport, RunResult

ILLEGAL = [chr(c) for c in range(0x20) if c not in (0x9, 0xA, 0xD)] + [
    "\ud800",
    "\udfff",
    "\ufffe",
    "\uffff",
]
"""Every character XML 1.0 forbids in the ranges a report meets: the C0 controls but
tab, newline and carriage return; lone surrogates; the two non-characters U+FFFE/F."""


def report(name: str, why: str, suite: str = "suite") -> EvalReport:
    runs = (
        RunResult(name, 0, "failed", error=why),
        RunResult(name + "!", 0, "errored", error=why),
        RunResult(name + "?", 0, "skipped", error=why),
        RunResult(name + ".", 0, "passed"),
    )
    return EvalReport(suite, None, "live", "now", 0.1, 1, 1, runs)


def strict_parse(data: bytes) -> ET.Element:
    """The document parsed by two strict parsers; both refuse what XML 1.0 forbids."""
    minidom.parseString(data)
    return ET.fromstring(data)


def shown(text: str) -> str:
    """``text`` as the report must show it: what XML forbids as a visible escape."""
    out = []
    for char in text:
        if char in ILLEGAL or 0xD800 <= ord(char) <= 0xDFFF:
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


def test_every_forbidden_character_is_escaped_and_the_file_parses() -> None:
    name = "case " + "".join(ILLEGAL)
    why = "output: \x1b[31mred\x1b[0m \x00 \ud83d end"
    xml = junit_xml(report(name, why, suite="s\x1b"))
    root = strict_parse(xml.encode("utf-8"))
    suite = root[0]
    assert suite.get("name") == "s\\x1b"
    failed = suite[0]
    assert failed.get("name") == shown(name)
    assert "\\x00" in failed.get("name", "") and "\\ud800" in failed.get("name", "")
    failure = failed.find("failure")
    assert failure is not None
    assert failure.text == "output: \\x1b[31mred\\x1b[0m \\x00 \\ud83d end"
    assert failure.get("message") == failure.text


# Any code point at all, surrogates included, weighted towards the ones XML forbids.
ANY_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(ILLEGAL),
        st.characters(codec=None),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.sampled_from(["<", "&", '"', "]", ">", "\t", "\n", "\r"]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(name=ANY_TEXT, why=ANY_TEXT, suite=ANY_TEXT)
def test_any_text_gives_well_formed_xml_that_keeps_every_legal_character(
    name: str, why: str, suite: str
) -> None:
    xml = junit_xml(report(name, why, suite=suite))
    root = strict_parse(xml.encode("utf-8"))
    assert root[0].get("name") == shown(suite)
    cases = root[0].findall("testcase")
    assert [c.get("name") for c in cases] == [shown(name + s) for s in ("", "!", "?", ".")]
    failure = cases[0].find("failure")
    assert failure is not None
    # attributes keep \r and \n (written as character references); element text is
    # read back with XML's line-end normalisation, as every parser does
    assert failure.get("message") == shown(why)[:500]
    text = shown(why).replace("\r\n", "\n").replace("\r", "\n")
    assert (failure.text or "") == text


def test_the_command_writes_a_junit_file_a_strict_parser_reads(tmp_path: Path) -> None:
    """End to end: a case named with an ESC whose agent answers with ANSI colours."""
    (tmp_path / "spec.toml").write_text(
        textwrap.dedent(
            """
            [llm]
            provider = "scripted"
            responses = [
                { tool_calls = [{ gate = "done", args = { answer = "\\u001b[31mred\\u0000" } }] },
            ]
            [circle]
            medium = "conversation"
            gates = ["done"]
            wards = [{ max_turns = 2 }]
            """
        ),
        encoding="utf-8",
    )
    (tmp_path / "suite.yaml").write_text(
        textwrap.dedent(
            """
            spec: spec.toml
            cases:
              - name: "colour \\e[1m"
                intent: Answer in colour.
                expect: { result_contains: green }
            """
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    out = subprocess.run(
        [sys.executable, "-m", "cantrip", "eval", "suite.yaml", "--junit", "out.xml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    root = strict_parse((tmp_path / "out.xml").read_bytes())
    case = root[0][0]
    assert case.get("name") == "colour \\x1b[1m"
    failure = case.find("failure")
    assert failure is not None
    assert "\\x1b[31mred\\x00" in (failure.text or "")
