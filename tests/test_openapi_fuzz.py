"""``cantrip serve`` against its own OpenAPI document, fuzzed by schemathesis (issue 20).

A real ``cantrip serve`` process (the CLI, on 127.0.0.1, an ephemeral port) is
started by the module's fixture, with a small live-session cap so that eviction
and resumption from the loom are exercised too. schemathesis loads
``/openapi.json`` from it and (1) generates requests for every operation from
the schemas -- valid ones and, in the negative mode, invalid ones -- and (2)
runs stateful sequences along the document's links (create a session, then
prompt it, read its thread, cancel it). Every response must match the document
(status code, content type, body schema) and none may be a 5xx. The run is
bounded (``max_examples``) to a few hundred requests.

``GET /sessions/{id}/events`` is an endless event stream by design; it is
described in the document but left out of the fuzzing (a request to it never
ends). Its behaviour is tested in ``test_http.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
ANSWERS = 3000
"""Scripted answers: more than the run will ever ask for (each prompt takes one)."""


def write_spec(folder: Path) -> Path:
    answers = ",\n".join(
        f'  {{ tool_calls = [{{ gate = "done", args = {{ answer = "answer {i}" }} }}] }}'
        for i in range(ANSWERS)
    )
    spec = folder / "fuzz.toml"
    spec.write_text(
        f'[llm]\nprovider = "scripted"\nresponses = [\n{answers}\n]\n'
        '[circle]\nmedium = "conversation"\ngates = ["done"]\nwards = [{ max_turns = 2 }]\n'
        '[loom]\npath = "fuzz.db"\n'
        "[memory]\n"
    )
    return spec


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from run_server(tmp_path_factory)


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of its own: the stateful run's steps depend on the server's answers,
    so it starts from a known state instead of what the other tests left behind."""
    yield from run_server(tmp_path_factory)


def run_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("openapi-fuzz")
    spec = write_spec(folder)
    process = subprocess.Popen(
        [CANTRIP, "serve", str(spec), "--port", "0", "--max-sessions", "4"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CANTRIP_DEBUG": ""},
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        assert found, f"cantrip serve did not start: {line}"
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.returncode == 0, "the server stopped cleanly"


def test_the_document_is_openapi_3_1_built_from_the_request_models(server: str) -> None:
    from cantrip.protocols.asgi._api_models import PromptRequest

    document = httpx.get(f"{server}/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    published = document["components"]["schemas"]["PromptRequest"]
    assert published["properties"].keys() == PromptRequest.model_json_schema()["properties"].keys()
    operations = {op["operationId"] for path in document["paths"].values() for op in path.values()}
    assert operations == {
        "health", "listSessions", "createSession", "getSession", "deleteSession", "prompt",
        "cancel",
        "thread", "events", "pending", "answerPause", "steer", "memoryNamespaces",
        "memoryItems", "memoryItem", "memoryForget",
    }  # fmt: skip


@pytest.fixture(scope="module")
def api(server: str) -> Any:
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    # A body over the server's limit is refused with 413 (documented on every route
    # that takes a body) -- as right a refusal of invalid data as a 400.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    return schema.exclude(operation_id="events")


FUZZ = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_answers_as_documented(api: Any, mode: GenerationMode) -> None:
    """Generated requests for each operation: valid ones, then invalid ones (wrong types,
    missing fields, bad parameters); each response is checked against the document."""
    calls: list[str] = []
    for result in api.get_all_operations():
        operation = result.ok()
        raw = operation.definition.raw
        if mode is GenerationMode.NEGATIVE and not (
            raw.get("parameters") or raw.get("requestBody")
        ):
            continue  # nothing to get wrong (GET /health, GET /sessions)

        @FUZZ
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(timeout=30)
            calls.append(f"{case.method} {case.path} -> {response.status_code}")

        run()
    assert len(calls) >= 5 * 3, "every operation was exercised"


def test_stateful_sequences_answer_as_documented(own_server: str) -> None:
    api = schemathesis.openapi.from_url(f"{own_server}/openapi.json")
    # A sequence may send an Idempotency-Key again with another prompt: 422 key_reused
    # (documented on the route) is the right answer to that schema-valid request -- the
    # schema cannot say a key's past; it surfaced once deleteSession changed the sequences.
    acceptance = api.config.checks.positive_data_acceptance
    acceptance.expected_statuses = [*acceptance.expected_statuses, "422"]
    workflow = api.exclude(operation_id="events").as_state_machine()
    workflow.run(
        settings=settings(
            max_examples=15,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
    )
