"""Every AG-UI event the tests see is held to the AG-UI 1.0 JSON Schema (issue 44).

The schema is vendored beside this file (``agui_schema/``, its README names the
package and version it comes from). Two doors, one check (:func:`check_event`):

* every event a server in the test process sends passes it on its way out: an
  autouse fixture wraps the one function that gives an event its wire form
  (``cantrip.protocols.agui._protocol.wire_data``) for every test, so a new test
  cannot forget it -- a failing event fails the test at teardown, naming the event
  and what the schema said;
* every event a test reads from a server in another process (``serve --db``
  replicas) or from the official JS client goes through :func:`parse_sse` or
  :func:`check_events`, which the AG-UI tests' helpers call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

SCHEMA_FILE = Path(__file__).parent / "agui_schema" / "ag-ui-1.0.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
_BY_TYPE = {
    branch["properties"]["type"]["const"]: jsonschema.Draft202012Validator(
        {**branch, "$defs": SCHEMA["$defs"]}
    )
    for branch in SCHEMA["anyOf"]
}
"""The schema's one branch per event type (it is an ``anyOf`` of them), each checked on
its own so a refusal names what is wrong in the event's own kind."""


class SchemaViolation(AssertionError):
    """An AG-UI event the 1.0 JSON Schema refuses."""


def check_event(data: Any) -> None:
    """``data`` is an AG-UI 1.0 event, or :class:`SchemaViolation` says why (the
    schema's best-matching complaint, with where in the event it is)."""
    kind = data.get("type") if isinstance(data, dict) else None
    validator = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if validator is None:
        raise SchemaViolation(f"not an AG-UI 1.0 event type: {str(kind)[:80]!r}")
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the event)"
        raise SchemaViolation(
            f"not an AG-UI 1.0 event at {where}: {error.message}\nevent: {json.dumps(data)[:2000]}"
        )


def check_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of ``events`` checked (:func:`check_event`); the events."""
    for event in events:
        check_event(event)
    return events


def sse_frames(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    """Each ``data:`` frame of an SSE body with its ``id:`` (None if it has none)."""
    frames = []
    for block in text.split("\n\n"):
        event_id: str | None = None
        for line in block.splitlines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                frames.append((event_id, json.loads(line[5:].strip())))
    return frames


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Every ``data:`` line of an AG-UI stream, each checked against the schema."""
    return check_events([data for _, data in sse_frames(text)])


@pytest.fixture(autouse=True)
def agui_events_follow_the_schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every AG-UI event a server in this process sends during the test is checked
    (see the module's docstring); the test fails at teardown if one was refused."""
    from cantrip.protocols.agui import _protocol

    refused: list[str] = []
    wire_data = _protocol.wire_data

    def checked(event: Any) -> Any:
        data = wire_data(event)
        try:
            check_event(data)
        except SchemaViolation as exc:
            refused.append(str(exc))
        return data

    monkeypatch.setattr(_protocol, "wire_data", checked)
    yield
    if refused:
        pytest.fail(
            f"{len(refused)} AG-UI event(s) the server sent fail the 1.0 JSON Schema; the "
            f"first: {refused[0]}",
            pytrace=False,
        )
