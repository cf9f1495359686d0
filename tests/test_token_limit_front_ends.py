"""A cast cut off by the output-token limit, as ACP and HTTP clients see it (issue 22).

The CLI's ``--json`` and a ``call_agent`` parent are covered in
``test_token_limit_casts.py``; both protocols here run in process over the
same scripted spec.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.http._serve import serve_http
from cantrip.spec import build_cantrip, parse_spec

CUT = "The story is about a"


def cut_spell() -> Any:
    return build_cantrip(
        parse_spec(
            {
                "llm": {
                    "provider": "scripted",
                    "responses": [{"content": CUT, "stop_reason": "max_tokens"}],
                },
                "circle": {
                    "medium": "conversation",
                    "gates": ["done"],
                    "wards": [{"max_turns": 4}],
                },
            }
        )
    )


async def test_acp_ends_the_prompt_with_max_tokens_and_says_it_is_partial() -> None:
    notes: list[dict[str, Any]] = []

    async def notify(message: dict[str, Any]) -> None:
        notes.append(message)

    server = AcpServer(cut_spell(), notify=notify)
    async with server.running():
        created = await server.handle({"jsonrpc": "2.0", "id": 1, "method": "session/new"})
        assert created is not None
        sid = created["result"]["sessionId"]
        response = await server.handle(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": "Tell me a long story."},
            }
        )
        assert response is not None
        result = response["result"]
        assert result["stopReason"] == "max_tokens"
        meta = result["_meta"]["cantrip"]
        assert meta["reason"] == "max_tokens" and meta["partial"] == CUT
        said = [
            n["params"]["update"]["content"]["text"]
            for n in notes
            if n.get("method") == "session/update"
            and n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        ]
        assert any("Cut off by the output token limit" in text and CUT in text for text in said)


async def test_http_reports_the_partial_text_apart_from_the_result() -> None:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_http, cut_spell(), "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            reply = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "story"})
        nursery.cancel_scope.cancel()
    assert reply.status_code == 200
    body = reply.json()
    assert body["stop_reason"] == "max_tokens" and body["reason"] == "max_tokens"
    assert (body["terminated"], body["truncated"]) == (False, True)
    assert body["result"] is None and body["partial"] == CUT
