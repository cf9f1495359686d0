"""``POST /sessions`` with a ``cwd``: the HTTP API's sessions work in a directory, as
ACP's do (``create(cwd=)``), in both modes.

In process (``cantrip serve`` on an SQLite loom) and at a ``serve --db`` replica (a
``cantrip worker`` process casts), on tests/test_serve_db.py's stack: the session
reports its ``cwd``, its casts record it as their ``cwd`` tag, a repeated key keeps
it; a bad one is a 400 saying what is wrong and makes nothing; and the OpenAPI document
describes the rule the one check (``check_cwd``) enforces.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pg_cluster import fresh_database
from test_a2a_modes import process_and_replica
from test_serve_db import Stack, open_stack

from cantrip.protocols.asgi._openapi import openapi_document
from cantrip.protocols.sessions import SessionError
from cantrip.protocols.sessions._values import CWD_SCHEMA, MAX_CWD_CHARS, check_cwd

MODES = ["process", "db"]
WHERE = "/home/alice/project"


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = fresh_database(pg_server, "http_cwd")
    with open_stack(url, tmp_path_factory.mktemp("http-cwd"), replicas=1) as built:
        yield built


@pytest.fixture(scope="module")
def servers(stack: Stack) -> dict[str, str]:
    """Each mode's server: in process on an SQLite loom, and the replica."""
    return process_and_replica(stack)


def created(client: httpx.Client, body: Any, key: str | None = None) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/sessions", json=body, headers=headers)


@pytest.mark.parametrize("mode", MODES)
def test_a_session_made_with_a_cwd_reports_it_and_its_casts_record_it(
    servers: dict[str, str], mode: str
) -> None:
    with httpx.Client(base_url=servers[mode], timeout=60) as client:
        made = created(client, {"cwd": WHERE})
        assert made.status_code == 201, made.text
        info = made.json()
        sid = info["session_id"]
        assert info["cwd"] == WHERE
        assert client.get(f"/sessions/{sid}").json()["cwd"] == WHERE
        listed = {s["session_id"]: s for s in client.get("/sessions").json()["sessions"]}
        assert listed[sid]["cwd"] == WHERE
        answered = client.post(f"/sessions/{sid}/prompt", json={"prompt": "one"})
        assert answered.status_code == 200, answered.text
        thread = client.get(f"/sessions/{sid}/thread").json()
        assert thread["cwd"] == WHERE
        assert thread["turns"][0]["extras"]["cwd"] == WHERE, "the cast's cwd tag"
        assert client.get(f"/sessions/{sid}/pending").json()["cwd"] == WHERE
        # a session made without one reports none
        plain = created(client, {}).json()
        assert "cwd" not in plain and "cwd" not in client.get("/sessions").json()["sessions"][-1]
        # a repeated key gets the session as it was made: its cwd kept
        key = uuid.uuid4().hex
        first = created(client, {"cwd": WHERE}, key)
        again = created(client, {"cwd": "/somewhere/else"}, key)
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json() and again.json()["cwd"] == WHERE


BAD = [
    ("relative/path", "cwd must be an absolute path"),
    ("", "cwd must be a non-empty string"),
    ("/a\x01b", "cwd holds a control character"),
    ("/tab\there", "cwd holds a control character"),
    ("/del\x7f", "cwd holds a control character"),
    ("/" + "a" * MAX_CWD_CHARS, f"cwd is longer than {MAX_CWD_CHARS} characters"),
    (7, "cwd: Input should be a valid string"),
]


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_cwd_is_a_400_saying_why_and_makes_nothing(
    servers: dict[str, str], mode: str
) -> None:
    """Each refused with the check's own words, before anything is made: the sessions
    listed are the same after, and the key each was sent with makes a new session
    later (none was made under it)."""
    with httpx.Client(base_url=servers[mode], timeout=60) as client:
        before = len(client.get("/sessions").json()["sessions"])
        keys = []
        for bad, why in BAD:
            keys.append(key := uuid.uuid4().hex)
            refused = created(client, {"cwd": bad}, key)
            assert refused.status_code == 400, (bad, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "bad_request" and error["message"].startswith(why), error
        assert len(client.get("/sessions").json()["sessions"]) == before
        for key in keys:
            made = created(client, {"cwd": WHERE}, key)
            assert made.status_code == 201 and "idempotent-replayed" not in made.headers
        longest = "/" + "a" * (MAX_CWD_CHARS - 1)  # at the limit: taken
        assert created(client, {"cwd": longest}).json()["cwd"] == longest


def accepted(cwd: str) -> bool:
    try:
        check_cwd(cwd)
    except SessionError:
        return False
    return True


def described(cwd: str, schema: dict[str, Any]) -> bool:
    """Whether the document's schema for ``cwd`` takes ``cwd`` (a JSON Schema pattern
    matches anywhere; this one is anchored)."""
    return (
        schema["minLength"] <= len(cwd) <= schema["maxLength"]
        and re.search(schema["pattern"], cwd) is not None
    )


def test_the_openapi_document_describes_the_rule_check_cwd_enforces() -> None:
    schemas = openapi_document()["components"]["schemas"]
    cwd = schemas["CreateSession"]["properties"]["cwd"]
    assert cwd["type"] == "string" and {k: cwd[k] for k in CWD_SCHEMA} == CWD_SCHEMA
    for shape in ("SessionInfo", "ThreadBody", "PendingBody"):
        assert schemas[shape]["properties"]["cwd"]["type"] == "string", shape
    samples = [bad for bad, _ in BAD if isinstance(bad, str)] + [
        WHERE, "/", "//server/share", "/with space/ünïcode", "/" + "a" * (MAX_CWD_CHARS - 1),
        "/a\nb", "/a\x1fb", "/a\x80b", "C:\\windows", "~/home", " /lead",
    ]  # fmt: skip
    assert [described(s, cwd) for s in samples] == [accepted(s) for s in samples]
