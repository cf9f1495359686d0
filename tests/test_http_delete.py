"""``DELETE /sessions/{id}``: one route over the backend's ``delete``, both modes.

In process (``cantrip serve`` on an SQLite loom) and at a ``serve --db`` replica (a
``cantrip worker`` process), on tests/test_serve_db.py's stack: a session's tree
leaves the loom, a prompt running keeps it (409 ``busy``), a session deleted is 404
everywhere after; a loom in memory cannot delete (501 ``unsupported``)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import trio
from pg_cluster import fresh_database
from test_a2a_modes import process_and_replica, serve_in_process
from test_serve_db import Stack, open_stack

from cantrip.protocols.asgi._openapi import openapi_document

MODES = ["process", "db"]


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = fresh_database(pg_server, "http_delete")
    with open_stack(url, tmp_path_factory.mktemp("http-delete"), replicas=1) as built:
        yield built


@pytest.fixture(scope="module")
def servers(stack: Stack) -> dict[str, str]:
    """Each mode's server: in process on an SQLite loom, and the replica."""
    return process_and_replica(stack)


@pytest.mark.loop_watch
@pytest.mark.parametrize("mode", MODES)
async def test_a_deleted_session_is_gone_and_a_running_one_stays(
    servers: dict[str, str], mode: str
) -> None:
    base = servers[mode]
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        sid = (await client.post("/sessions")).json()["session_id"]
        answered = await client.post(f"/sessions/{sid}/prompt", json={"prompt": "one"})
        assert answered.status_code == 200, answered.text

        async def prompt_in_background() -> None:
            done = await client.post(f"/sessions/{sid}/prompt", json={"prompt": "two"})
            assert done.status_code == 200, done.text

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prompt_in_background)
            with trio.fail_after(30):  # until the second prompt is open
                while not (await client.get(f"/sessions/{sid}")).json()["running"]:
                    await trio.sleep(0.02)
            refused = await client.delete(f"/sessions/{sid}")
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "busy"
        assert (await client.get(f"/sessions/{sid}")).json()["turns"] == 6

        deleted = await client.delete(f"/sessions/{sid}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"session_id": sid, "deleted": True}
        for answer in (
            await client.get(f"/sessions/{sid}"),
            await client.get(f"/sessions/{sid}/thread"),
            await client.delete(f"/sessions/{sid}"),
        ):
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_session"
        listed = [s["session_id"] for s in (await client.get("/sessions")).json()["sessions"]]
        assert sid not in listed


def test_a_loom_in_memory_cannot_delete_and_keeps_the_session(stack: Stack) -> None:
    base = serve_in_process(stack, stack.spec)  # no [loom]: in memory
    with httpx.Client(base_url=base, timeout=60) as client:
        sid = client.post("/sessions").json()["session_id"]
        assert client.post(f"/sessions/{sid}/prompt", json={"prompt": "one"}).status_code == 200
        refused = client.delete(f"/sessions/{sid}")
        assert refused.status_code == 501 and refused.json()["error"]["code"] == "unsupported"
        assert client.get(f"/sessions/{sid}").json()["turns"] == 3


def test_the_api_document_describes_the_delete() -> None:
    operation = openapi_document()["paths"]["/sessions/{session_id}"]["delete"]
    assert operation["operationId"] == "deleteSession"
    assert {"200", "404", "409", "501"} <= set(operation["responses"])
