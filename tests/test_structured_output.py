"""Structured output: ``done``'s answer takes a schema, is validated, and is parsed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

import cantrip
from cantrip.cli._main import main as cli_main
from cantrip.spec import build_cantrip, parse_spec
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
    from cantrip._outcome import result_dict

    s = spell([done_with({"name": "Oslo", "population": 3})], City)
    outcome = await s.cast_async("Which city?")
    assert result_dict(outcome)["result"] == {"name": "Oslo", "population": 3}


# -- untrusted answers against a schema: linear-time patterns, no retrieval, no ref cycles
# (issue 28, item 2). The module's loop watch fails a test whose validation holds the loop.


async def test_a_backtracking_pattern_cannot_stall_the_loop() -> None:
    """``^(a+)+$`` against ``a...a!`` backtracks exponentially in a backtracking engine
    (24 a's: about a second of the loop; 40: hours). Matched in linear time it is a
    plain refusal, and the model can try again."""
    schema = {"type": "string", "pattern": "^(a+)+$"}
    s = spell([done_with("a" * 24 + "!"), done_with("aaaa")], schema)
    outcome = await s.cast_async("Say a's")
    assert outcome.result == "aaaa"
    refused = outcome.turns[0].gate_calls[0]
    assert refused.is_error
    assert refused.result == (
        "the answer does not match the output schema: answer: "
        '"aaaaaaaaaaaaaaaaaaaaaaaa!" does not match "^(a+)+$"'
    )


async def test_pattern_properties_are_matched_in_linear_time_too() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    s = spell([done_with({"a" * 24 + "!": 1}), done_with({"aa": 1})], schema)
    outcome = await s.cast_async("Name it")
    assert outcome.result == {"aa": 1}
    assert "Additional properties are not allowed" in str(outcome.turns[0].gate_calls[0].result)


def test_a_pattern_the_linear_engine_cannot_compile_is_refused_at_load() -> None:
    with pytest.raises(cantrip.ConstructionError) as info:
        spell([], {"type": "string", "pattern": "^(a)\\1$"})
    assert str(info.value) == (
        'output schema cannot be used: "^(a)\\\\1$" is not a "regex" (patterns are '
        "matched in linear time, so look-around and back-references are not supported)"
    )


@pytest.fixture
def schema_server() -> Any:
    """A loopback HTTP server that serves a schema and counts the requests it gets."""
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = json.dumps({"type": "string"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", hits
    finally:
        server.shutdown()
        thread.join()


async def test_a_remote_ref_is_refused_at_load_and_never_fetched(schema_server: Any) -> None:
    url, hits = schema_server
    schema = {"type": "object", "properties": {"x": {"$ref": url}}}
    with pytest.raises(cantrip.ConstructionError) as info:
        s = spell([done_with({"x": "a"}), done_with({"x": "b"})], schema)
        await s.cast_async("Answer")
    assert str(info.value) == (
        f"output schema cannot be used: $ref {url!r} points outside the schema; "
        "cantrip never retrieves a reference (remote URLs and files are refused)"
    )
    assert hits == []


def test_a_file_ref_is_refused_at_load() -> None:
    with pytest.raises(cantrip.ConstructionError) as info:
        spell([], {"$ref": "file:///etc/passwd"})
    assert str(info.value) == (
        "output schema cannot be used: $ref 'file:///etc/passwd' points outside the schema; "
        "cantrip never retrieves a reference (remote URLs and files are refused)"
    )


@pytest.mark.parametrize(
    ("schema", "cycle"),
    [
        ({"$ref": "#"}, "# -> #"),
        ({"allOf": [{"$ref": "#"}]}, "# -> #"),
        (
            {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
                "$ref": "#/$defs/a",
            },
            "#/$defs/a -> #/$defs/b -> #/$defs/a",
        ),
    ],
)
def test_a_ref_cycle_is_refused_at_load(schema: dict[str, Any], cycle: str) -> None:
    with pytest.raises(cantrip.ConstructionError) as info:
        spell([], schema)
    assert str(info.value) == (
        f"output schema cannot be used: $ref cycle {cycle} never reaches a value to check "
        "(a reference may recur only inside properties or items)"
    )


async def test_a_recursive_schema_through_items_still_works() -> None:
    tree = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "kids": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["name"],
    }
    answer = {"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]}
    s = spell([done_with({"name": "a", "kids": [{"kids": []}]}), done_with(answer)], tree)
    outcome = await s.cast_async("A tree")
    assert outcome.result == answer
    refused = str(outcome.turns[0].gate_calls[0].result)
    assert refused.endswith('kids.0: "name" is a required property')


async def test_an_answer_nested_too_deep_never_reaches_the_validator() -> None:
    """The native validator recurses with the answer (10,000 levels crash it): the
    value boundary refuses deep answers before any schema sees them."""
    deep: Any = []
    for _ in range(300):  # the native validator recurses with the answer
        deep = [deep]
    schema = {"type": "array", "items": {"$ref": "#"}}
    s = spell([done_with(deep), done_with([[]])], schema)
    outcome = await s.cast_async("Nest")
    assert outcome.result == [[]]
    assert outcome.turns[0].gate_calls[0].result == (
        "done() argument 'answer' is nested deeper than 100 levels; flatten it first"
    )
