"""An A2A Agent Card people can read (issue 47.7): the cantrip's name (a spec's
``name``, else its file's stem) rather than a random id, and gate descriptions without
the reST markup their docstrings carry."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

from cantrip._plain_doc import plain_doc
from cantrip.cli._spec_file import load_cantrip
from cantrip.protocols.a2a._server import agent_card

SPEC = """
[llm]
provider = "scripted"
responses = [{ content = "ok" }]
[circle]
medium = "conversation"
gates = ["done", "echo", { name = "read", dependencies = { root = "." } }]
wards = [{ max_turns = 3 }]
"""


def card(path: Path) -> dict[str, object]:
    return MessageToDict(agent_card(load_cantrip(path), "http://127.0.0.1:1"))


def test_the_card_is_named_after_the_spec_file_and_its_skills_read_plainly(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "travel-desk.toml"
    spec.write_text(SPEC)
    shown = card(spec)
    assert shown["name"] == "travel-desk"
    skills = {s["id"]: s["description"] for s in shown["skills"]}  # type: ignore[attr-defined]
    assert skills["echo"] == "Return text unchanged."
    assert "``" not in skills["read"] and skills["read"].startswith("Read the text file at path")


def test_a_spec_name_wins_over_the_file_stem(tmp_path: Path) -> None:
    spec = tmp_path / "agent.toml"
    spec.write_text('name = "Travel desk"\n' + SPEC)
    assert card(spec)["name"] == "Travel desk"


def test_an_empty_spec_name_is_refused_at_load(tmp_path: Path) -> None:
    from cantrip._errors import CantripError

    spec = tmp_path / "agent.toml"
    spec.write_text('name = ""\n' + SPEC)
    with pytest.raises(CantripError, match="name"):
        load_cantrip(spec)


@pytest.mark.parametrize(
    ("doc", "plain"),
    [
        ("Return ``text`` unchanged.", "Return text unchanged."),
        ("See :func:`cantrip.cast` and :class:`~cantrip.loom.Loom`.", "See cantrip.cast and Loom."),
        ("A `link <https://example.org>`_ here.", "A link here."),
        (":ref:`the guide <guide>` says so", "the guide says so"),
        ("*emphasis* and plain words stay", "*emphasis* and plain words stay"),
        ("a `titled` reference", "a titled reference"),
    ],
)
def test_plain_doc_keeps_the_words_and_drops_the_markup(doc: str, plain: str) -> None:
    assert plain_doc(doc) == plain
