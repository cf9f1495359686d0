"""Structured output: ``done``'s answer takes a schema, is validated, and is parsed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

import cantrip
from cantrip._specfile import build_cantrip, parse_spec
from cantrip.cli._main import main as cli_main
from gates import done, echo

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)


class City(pydantic.BaseModel):
    name: str
    population: int


def done_with(answer: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": "done", "args": {"answer": answer}}]}


def spell(script: list[dict[str, Any]], output: Any, *gates: cantrip.Gate) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, *gates], [cantrip.max_turns(5)]),
        output=output,
    )


async def test_a_pydantic_model_is_dones_schema_and_the_result_is_an_instance() -> None:
    answers = [{"name": "Oslo"}, {"name": "Oslo", "population": 709000}]
    s = spell([done_with(a) for a in answers], City)
    outcome = await s.cast_async("Which city?")
    assert outcome.terminated and outcome.reason == "done"
    assert outcome.result == City(name="Oslo", population=709000)
    assert isinstance(outcome.result, City)
    first, second = outcome.turns
    refused = first.gate_calls[0]
    assert refused.is_error and "population" in str(refused.result)
    assert "output schema" in str(refused.result)
    assert not first.terminated
    # the loom keeps JSON, readable by any process
    assert second.result == {"name": "Oslo", "population": 709000}
    # the LLM saw the model's schema as done's answer parameter
    query = s.llm.invocations[0]  # type: ignore[attr-defined]
    done_tool = next(t for t in query.tools if t.name == "done")
    answer = done_tool.parameters["properties"]["answer"]
    assert set(answer["properties"]) == {"name", "population"}
    assert done_tool.parameters["required"] == ["answer"]


async def test_nested_models_keep_their_definitions_resolvable() -> None:
    class Country(pydantic.BaseModel):
        capital: City
        cities: list[City]

    s = spell([done_with({"capital": {"name": "Oslo", "population": 1}, "cities": []})], Country)
    outcome = await s.cast_async("Describe Norway")
    assert outcome.result.capital.name == "Oslo"
    parameters = s.circle.gate("done").parameters  # type: ignore[union-attr]
    assert "City" in parameters["$defs"]
    assert parameters["properties"]["answer"]["properties"]["capital"]["$ref"] == ("#/$defs/City")


async def test_a_json_schema_output_is_checked_with_jsonschema() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1}},
        "required": ["n"],
    }
    s = spell([done_with({"n": 0}), done_with({"n": "3"}), done_with({"n": 3})], schema)
    outcome = await s.cast_async("Count")
    assert outcome.result == {"n": 3}
    errors = [t.gate_calls[0].result for t in outcome.turns[:2]]
    assert "minimum" in str(errors[0]) and "n:" in str(errors[0])
    assert "integer" in str(errors[1])


async def test_a_text_only_reply_does_not_end_a_structured_cast() -> None:
    s = spell([{"content": "Oslo, about 700k"}, done_with({"name": "Oslo", "population": 7})], City)
    outcome = await s.cast_async("Which city?")
    assert len(outcome.turns) == 2
    assert not outcome.turns[0].terminated
    assert outcome.result.name == "Oslo"


async def test_the_code_medium_validates_done_obj_the_same_way() -> None:
    from mediums.js import js

    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {"code": "done({name: 'Oslo'})"},
                {"code": "done({name: 'Oslo', population: 5})"},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(4)], js),
        output=City,
    )
    outcome = await s.cast_async("Which city?")
    assert outcome.result == City(name="Oslo", population=5)
    assert "population" in outcome.turns[0].observation


def test_an_invalid_json_schema_is_a_construction_error() -> None:
    with pytest.raises(cantrip.ConstructionError, match="not a valid JSON Schema"):
        spell([], {"type": "no-such-type"})


def test_a_type_pydantic_cannot_describe_is_a_construction_error() -> None:
    with pytest.raises(cantrip.ConstructionError, match="cannot be a schema"):
        spell([], object())


def base_spec(output: dict[str, Any]) -> dict[str, Any]:
    return {
        "llm": {"provider": "scripted", "responses": [done_with({"n": 0}), done_with({"n": 2})]},
        "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 4}]},
        "output": output,
    }


async def test_a_spec_file_output_schema() -> None:
    doc = parse_spec(base_spec({"schema": {"type": "object", "properties": {"n": {"minimum": 1}}}}))
    outcome = await build_cantrip(doc).cast_async("Count")
    assert outcome.result == {"n": 2}
    assert outcome.turns[0].gate_calls[0].is_error


async def test_a_spec_file_output_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shapes_for_test.py").write_text(
        "import pydantic\nclass Count(pydantic.BaseModel):\n    n: int = pydantic.Field(ge=1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = parse_spec(base_spec({"model": "shapes_for_test:Count"}))
    outcome = await build_cantrip(doc).cast_async("Count")
    assert type(outcome.result).__name__ == "Count" and outcome.result.n == 2
    sys.modules.pop("shapes_for_test", None)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ({}, "exactly one of"),
        ({"schema": {"type": "object"}, "model": "a:B"}, "exactly one of"),
        ({"model": "no_such_module_here:Thing"}, "no_such_module_here"),
        ({"model": "json"}, "package.module:Class"),
        ({"model": "json:NoSuchClass"}, "has no 'NoSuchClass'"),
        ({"schema": {"type": 5}}, "not a valid JSON Schema"),
    ],
)
def test_spec_output_errors_are_clear(output: dict[str, Any], message: str) -> None:
    with pytest.raises(cantrip.ConstructionError, match=message):
        build_cantrip(parse_spec(base_spec(output)))


def test_cast_json_prints_the_structured_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "structured.toml"
    spec.write_text(
        """
[llm]
provider = "scripted"
responses = [{tool_calls = [{gate = "done", args = {answer = {n = 4}}}]}]

[circle]
medium = "conversation"
gates = ["done"]
wards = [{max_turns = 3}]

[output]
schema = {type = "object", properties = {n = {type = "integer"}}, required = ["n"]}
"""
    )
    code = cli_main(["cast", "--json", "-q", str(spec), "count"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["result"] == {"n": 4}
    assert data["terminated"] is True


async def test_other_gates_are_untouched_by_the_output_schema() -> None:
    s = spell(
        [
            {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
            done_with({"name": "A", "population": 1}),
        ],
        City,
        echo,
    )
    outcome = await s.cast_async("echo then answer")
    assert outcome.turns[0].gate_calls[0].result == "hi"
    assert outcome.result.name == "A"


async def test_result_dict_reports_a_model_result_as_json() -> None:
    from cantrip.protocols._sessions import result_dict

    s = spell([done_with({"name": "Oslo", "population": 3})], City)
    outcome = await s.cast_async("Which city?")
    assert result_dict(outcome)["result"] == {"name": "Oslo", "population": 3}
