"""Loopback servers for reasoning models: they sign what they think and check it comes back.

Each fake here issues reasoning artefacts the way the real API does and
refuses a request the real API refuses, with the documented rule cited next
to each check:

* :class:`FakeThinkingAnthropic` -- ``thinking`` blocks with a ``signature``
  (an HMAC of the text under the fake's own key) and, on request,
  ``redacted_thinking`` blocks; prompt-cache accounting from the request's
  ``cache_control`` breakpoints.
* :class:`FakeThinkingGemini` -- Gemini 3: a ``thoughtSignature`` on the
  first function call of each step (and on the last text part).
* :class:`FakeResponses` -- the OpenAI Responses API, stateless: ``reasoning``
  items with ``encrypted_content``, ``function_call`` / ``function_call_output``
  items, its streaming events, cached input from ``prompt_cache_key``.

Signatures are HMACs, so an altered thinking text, an altered signature and
a signature from another fake all fail the check, as they do for real.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
from fake_providers import (
    Answer,
    FakeAnthropic,
    FakeGemini,
    FakeProvider,
    Rejected,
    Reply,
    Request,
    StreamError,
    arguments_text,
    pieces,
    serve,
    sse,
)

ANTHROPIC_THINKING = (
    "https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking"
    "#preserving-thinking-blocks"
)
ANTHROPIC_CACHING = (
    "https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching#structuring-your-prompt"
)
ANTHROPIC_ADAPTIVE = "https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking"
ADAPTIVE_ONLY = frozenset({"claude-sonnet-5-5", "claude-opus-5-5", "claude-fable-5-1"})
"""Models that refuse a thinking budget (in the fake: the ones the tests use)."""
GEMINI_SIGNATURES = "https://ai.google.dev/gemini-api/docs/thought-signatures"
RESPONSES_REASONING = "https://platform.openai.com/docs/guides/reasoning#encrypted-reasoning-items"
RESPONSES_FUNCTIONS = (
    "https://platform.openai.com/docs/guides/function-calling#handling-function-calls"
)


class Signer:
    """HMAC tokens under a key only this fake knows."""

    def __init__(self) -> None:
        self.key = secrets.token_bytes(16)

    def sign(self, text: str) -> str:
        digest = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return base64.b64encode(digest).decode()

    def valid(self, text: str, token: Any) -> bool:
        return isinstance(token, str) and hmac.compare_digest(self.sign(text), token)


def _prefix_tokens(text: str) -> int:
    return max(len(text) // 4, 1)


# -- Anthropic -----------------------------------------------------------------------------------


class FakeThinkingAnthropic(FakeAnthropic):
    """Messages API with extended thinking, signatures checked, caching accounted."""

    def __init__(self, script: Sequence[Reply], *, key: str = "test-key", redact: bool = False):
        super().__init__(script, key=key)
        self.signer = Signer()
        self.redact = redact
        """Also emit a ``redacted_thinking`` block after each thinking block."""
        self.issued: dict[str, list[dict[str, Any]]] = {}
        """tool_use id -> the thinking blocks issued before it in the same response."""
        self.cached_prefixes: set[str] = set()
        self.cache_usage: tuple[int, int] = (0, 0)
        """(read, written) of the request being answered."""

    def thinking_blocks(self, answer: Answer, n: int) -> list[dict[str, Any]]:
        if not answer.thinking:
            return []
        blocks: list[dict[str, Any]] = [
            {
                "type": "thinking",
                "thinking": answer.thinking,
                "signature": self.signer.sign(answer.thinking),
            }
        ]
        if self.redact:
            secret = f"redacted-{n}"
            blocks.append(
                {"type": "redacted_thinking", "data": f"{secret}:{self.signer.sign(secret)}"}
            )
        return blocks

    def validate(self, request: Request, body: Any) -> None:
        super().validate(request, body)
        thinking = body.get("thinking")
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        enabled = kind in ("enabled", "adaptive")
        adaptive = body["model"] in ADAPTIVE_ONLY
        if kind == "enabled":
            if adaptive:
                # Current models take adaptive thinking only; a budget is a 400
                # (ANTHROPIC_ADAPTIVE).
                raise Rejected("thinking.type: 'enabled' is not supported for this model")
            budget = thinking.get("budget_tokens")
            # "budget_tokens must be set to a value less than max_tokens", minimum 1024.
            if not isinstance(budget, int) or budget < 1024 or budget >= body["max_tokens"]:
                raise Rejected("thinking.budget_tokens: must be >= 1024 and less than max_tokens")
        elif kind == "adaptive":
            effort = (body.get("output_config") or {}).get("effort", "high")
            if effort not in ("low", "medium", "high", "max"):
                raise Rejected(f"output_config.effort: unknown value {effort!r}")
        if enabled and ("temperature" in body or "top_p" in body):
            # "Thinking isn't compatible with temperature or top_k modifications"
            # (ANTHROPIC_THINKING, feature compatibility).
            raise Rejected("temperature and top_p may not be set while thinking is enabled")
        if enabled and (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            # "Tool use with thinking only supports tool_choice auto or none" (ANTHROPIC_THINKING).
            raise Rejected("Thinking may not be enabled when tool_choice forces tool use.")
        messages = body["messages"]
        for i, message in enumerate(messages):
            blocks = message["content"]
            if isinstance(blocks, str):
                continue
            for j, block in enumerate(blocks):
                # Thinking blocks come back exactly as issued: the signature verifies them
                # ("you must pass the complete unmodified block back": ANTHROPIC_THINKING).
                if block["type"] == "thinking":
                    if not self.signer.valid(block.get("thinking", ""), block.get("signature")):
                        raise Rejected(
                            f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                        )
                elif block["type"] == "redacted_thinking":
                    secret, _, token = str(block.get("data", "")).partition(":")
                    if not self.signer.valid(secret, token):
                        raise Rejected(
                            f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
                        )
                if block.get("cache_control") and block["type"] in (
                    "thinking",
                    "redacted_thinking",
                ):
                    # Thinking blocks take no cache_control of their own (ANTHROPIC_CACHING).
                    raise Rejected(f"messages.{i}.content.{j}: thinking blocks cannot be cached")
        if enabled and len(messages) >= 2:
            # In a tool-use loop the final assistant message must start with the thinking
            # blocks of the response that made its tool calls, unchanged and in order
            # ("during tool use, you must pass thinking blocks back": ANTHROPIC_THINKING).
            last = messages[-1]["content"]
            answering = not isinstance(last, str) and any(b["type"] == "tool_result" for b in last)
            assistant = messages[-2]
            if answering and assistant["role"] == "assistant":
                blocks = assistant["content"]
                uses = [b for b in blocks if b["type"] == "tool_use"]
                expected = self.issued.get(uses[0]["id"], []) if uses else []
                if expected:
                    if blocks[0]["type"] not in ("thinking", "redacted_thinking"):
                        raise Rejected(
                            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
                            "`redacted_thinking`, but found "
                            f"`{blocks[0]['type']}`. When `thinking` is enabled, a final "
                            "`assistant` message must start with a thinking block."
                        )
                    leading = [b for b in blocks if b["type"] in ("thinking", "redacted_thinking")]
                    if leading != expected:
                        raise Rejected(
                            "thinking blocks of the final assistant message were modified, "
                            "reordered or dropped"
                        )
        self.cache_usage = self.account_cache(body)

    def account_cache(self, body: Any) -> tuple[int, int]:
        """Cache reads and writes from the ``cache_control`` breakpoints (ANTHROPIC_CACHING).

        The cached prefix runs tools -> system -> messages up to a marked block;
        a later request whose prefix up to a breakpoint is byte-identical reads it.
        """
        sequence: list[Any] = []
        marks: list[int] = []

        def take(block: Any, where: str) -> None:
            plain = {k: v for k, v in block.items() if k != "cache_control"}
            sequence.append([where, plain])
            if "cache_control" in block:
                if block["cache_control"] != {"type": "ephemeral"}:
                    raise Rejected("cache_control.type: must be 'ephemeral'")
                marks.append(len(sequence))

        for tool in body.get("tools") or ():
            take(tool, "tool")
        system = body.get("system")
        if isinstance(system, list):
            for block in system:
                take(block, "system")
        elif system:
            sequence.append(["system", system])
        for message in body["messages"]:
            blocks = message["content"]
            if isinstance(blocks, str):
                sequence.append([message["role"], blocks])
                continue
            for block in blocks:
                take(block, message["role"])
        if len(marks) > 4:
            # "You can define up to 4 cache breakpoints" (ANTHROPIC_CACHING).
            raise Rejected("A maximum of 4 blocks with cache_control may be provided.")
        read = written = 0
        best = 0
        for mark in marks:
            # A hit may be at any block boundary up to ~20 blocks before a breakpoint
            # ("automatic prefix checking", ANTHROPIC_CACHING).
            for end in range(mark, max(mark - 20, 0), -1):
                key = json.dumps(sequence[:end], sort_keys=True)
                if key in self.cached_prefixes:
                    best = max(best, _prefix_tokens(key))
                    break
        for mark in marks:
            key = json.dumps(sequence[:mark], sort_keys=True)
            if key not in self.cached_prefixes:
                self.cached_prefixes.add(key)
                written = max(written, _prefix_tokens(key) - best)
        read = best
        return read, written

    def usage(self, answer: Answer) -> dict[str, Any]:
        read, written = self.cache_usage
        if not (read or written):
            return super().usage(answer)
        return {
            "input_tokens": answer.prompt_tokens,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "output_tokens": answer.completion_tokens,
        }

    def record(self, answer: Answer, n: int, blocks: list[dict[str, Any]]) -> None:
        for i, call in enumerate(answer.calls):
            self.issued[self.call_id(call, n, i)] = [dict(b) for b in blocks]

    def whole(self, answer: Answer, body: Any, n: int) -> dict[str, Any]:
        payload = super().whole(attrs_without_thinking(answer), body, n)
        blocks = self.thinking_blocks(answer, n)
        payload["content"] = blocks + payload["content"]
        self.record(answer, n, blocks)
        return payload

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        out = super().events(attrs_without_thinking(answer), body, n)
        blocks = self.thinking_blocks(answer, n)
        self.record(answer, n, blocks)
        if not blocks:
            return out
        extra: list[str] = []
        for index, block in enumerate(blocks):
            if block["type"] == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])
                ]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            else:
                start, deltas = block, []
            extra.append(
                sse(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
            for delta in deltas:
                extra.append(
                    sse(
                        {"type": "content_block_delta", "index": index, "delta": delta},
                        "content_block_delta",
                    )
                )
            extra.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        # Shift the other blocks' indexes past the thinking blocks.
        shifted = []
        for event in out[2:]:
            shifted.append(_shift_index(event, len(blocks)))
        return out[:2] + extra + shifted


def attrs_without_thinking(answer: Answer) -> Answer:
    return attrs.evolve(answer, thinking=None)


def _shift_index(event: str, by: int) -> str:
    lines = event.split("\n")
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = json.loads(line[6:])
            if isinstance(data, dict) and "index" in data:
                data["index"] += by
            line = "data: " + json.dumps(data)
        out.append(line)
    return "\n".join(out)


# -- Gemini 3 ----------------------------------------------------------------------------------


class FakeThinkingGemini(FakeGemini):
    """generateContent for Gemini 3: thought signatures issued and required back."""

    def __init__(self, script: Sequence[Reply], *, key: str = "test-key") -> None:
        super().__init__(script, key=key)
        self.signer = Signer()
        self.issued: set[str] = set()

    def signature(self, n: int, what: str) -> str:
        return self.signer.sign(f"{n}:{what}")

    def validate(self, request: Request, body: Any) -> None:
        super().validate(request, body)
        if not self.model(request).startswith("gemini-3"):
            return
        contents = body["contents"]
        # The current turn starts after the last user content with text (not a functionResponse).
        start = 0
        for i, content in enumerate(contents):
            if content["role"] == "user" and any("text" in p for p in content["parts"]):
                start = i + 1
        for i, content in enumerate(contents):
            for j, part in enumerate(content["parts"]):
                token = part.get("thoughtSignature")
                if token is not None and not self.valid(token):
                    raise Rejected(f"contents[{i}].parts[{j}]: Thought signature is not valid")
            if i < start or content["role"] != "model":
                continue
            calls = [p for p in content["parts"] if "functionCall" in p]
            # "The first function call part in each step of the current turn must carry its
            # signature": a missing one is a 400 (GEMINI_SIGNATURES, function calling).
            if calls and "thoughtSignature" not in calls[0]:
                raise Rejected(
                    "Function call is missing a thought_signature in functionCall parts. "
                    f"Additional data, function call {calls[0]['functionCall']['name']}, "
                    f"position {i}. Please refer to {GEMINI_SIGNATURES} for more details."
                )

    def valid(self, token: str) -> bool:
        # The documented stand-in for history Gemini 3 did not produce (GEMINI_SIGNATURES, FAQ).
        return token in self.issued or token == "skip_thought_signature_validator"

    def parts(self, answer: Answer) -> list[dict[str, Any]]:
        parts = super().parts(answer)
        n = self.served
        calls = [p for p in parts if "functionCall" in p]
        if calls:
            calls[0]["thoughtSignature"] = self.remember(self.signature(n, "call"))
        elif parts and "text" in parts[-1] and not parts[-1].get("thought"):
            parts[-1]["thoughtSignature"] = self.remember(self.signature(n, "text"))
        return parts

    def remember(self, token: str) -> str:
        self.issued.add(token)
        return token

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        out: list[str] = []
        parts = self.parts(answer)

        def chunk(chunk_parts: list[dict[str, Any]], final: bool = False) -> None:
            candidate: dict[str, Any] = {
                "content": {"role": "model", "parts": chunk_parts},
                "index": 0,
            }
            data: dict[str, Any] = {
                "candidates": [candidate],
                "modelVersion": self.current_model,
                "responseId": f"resp-{n}",
            }
            if final:
                candidate["finishReason"] = "MAX_TOKENS" if answer.stop == "length" else "STOP"
                data["usageMetadata"] = self.usage(answer)
            out.append(sse(data))

        for part in parts:
            if "text" in part:
                texts = pieces(part["text"]) or [""]
                for k, text in enumerate(texts):
                    piece: dict[str, Any] = {"text": text}
                    if part.get("thought"):
                        piece["thought"] = True
                    if k == len(texts) - 1 and "thoughtSignature" in part:
                        piece["thoughtSignature"] = part["thoughtSignature"]
                    chunk([piece])
        calls = [p for p in parts if "functionCall" in p]
        chunk(calls, final=True)
        return out


# -- OpenAI Responses ------------------------------------------------------------------------------


class FakeResponses(FakeProvider):
    """``POST /v1/responses``: stateless reasoning items, function calls, streaming events."""

    path = "/v1/responses"

    def __init__(self, script: Sequence[Reply], *, key: str = "test-key") -> None:
        super().__init__(script, key=key)
        self.signer = Signer()
        self.follows: dict[str, str] = {}
        """reasoning item id -> id of the item it was issued right before."""
        self.needs: dict[str, str] = {}
        """function_call item id -> the reasoning item issued before it."""
        self.cache: dict[str, list[str]] = {}
        self.cached_tokens = 0

    def error_body(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        body = super().error_body(status, message, code)
        body["error"]["param"] = "input" if status == 400 else None
        return body

    def validate(self, request: Request, body: Any) -> None:
        if request.path != self.path:
            raise Rejected(f"unknown path {request.path}")
        if not isinstance(body.get("model"), str) or not isinstance(body.get("input"), list):
            raise Rejected("model and input are required")
        if body.get("store") is not False:
            raise Rejected("this fake serves stateless requests only (store: false)")
        if "tool_choice" in body and not body.get("tools"):
            raise Rejected("tool_choice is only allowed when tools are specified")
        for tool in body.get("tools") or ():
            if tool.get("type") != "function" or not tool.get("name") or "function" in tool:
                raise Rejected("tools[].type function needs name/parameters at the top level")
        items = body["input"]
        calls: dict[str, int] = {}
        answered: set[str] = set()
        seen_ids: set[str] = set()
        for i, item in enumerate(items):
            kind = item.get("type", "message" if "role" in item else None)
            if kind == "reasoning":
                rid = item.get("id", "")
                # Stateless: nothing is stored, so a reasoning item must bring its
                # encrypted_content, verified as issued (RESPONSES_REASONING).
                if "encrypted_content" not in item:
                    raise Rejected(
                        f"Item with id '{rid}' not found. Items are not persisted when "
                        "`store` is set to false."
                    )
                if not self.signer.valid(rid, item["encrypted_content"]):
                    raise Rejected(f"The encrypted content for item {rid} could not be verified.")
                # A reasoning item travels with the item it preceded (RESPONSES_FUNCTIONS).
                following = next((x for x in items[i + 1 :] if x.get("type") != "reasoning"), None)
                expected = self.follows.get(rid)
                if expected is not None and (following is None or following.get("id") != expected):
                    raise Rejected(
                        f"Item '{rid}' of type 'reasoning' was provided without its required "
                        "following item."
                    )
            elif kind == "function_call":
                fid = item.get("id")
                if not isinstance(item.get("arguments"), str):
                    raise Rejected("function_call.arguments must be a string")
                required = self.needs.get(fid or "")
                if required is not None and required not in seen_ids:
                    # "reasoning items must be passed back with the function calls they
                    # preceded" (RESPONSES_FUNCTIONS, RESPONSES_REASONING).
                    raise Rejected(
                        f"Item '{fid}' of type 'function_call' was provided without its "
                        f"required 'reasoning' item: '{required}'."
                    )
                calls[item["call_id"]] = i
            elif kind == "function_call_output":
                if item.get("call_id") not in calls:
                    raise Rejected(
                        "No tool call found for function call output with call_id "
                        f"{item.get('call_id')}."
                    )
                answered.add(item["call_id"])
            elif kind == "message":
                if item.get("role") not in ("user", "assistant", "system", "developer"):
                    raise Rejected(f"input[{i}]: invalid role")
            else:
                raise Rejected(f"input[{i}]: unknown item type {kind!r}")
            if item.get("id"):
                seen_ids.add(item["id"])
        missing = [c for c in calls if c not in answered]
        if missing:
            raise Rejected(f"No tool output found for function call {missing[0]}.")
        self.cached_tokens = self.account_cache(body)

    def account_cache(self, body: Any) -> int:
        """Leading input items identical to the last request with the same cache key."""
        key = body.get("prompt_cache_key")
        if not key:
            return 0
        current = [json.dumps(item, sort_keys=True) for item in body["input"]]
        previous = self.cache.get(key, [])
        self.cache[key] = current
        shared = 0
        for a, b in zip(previous, current, strict=False):
            if a != b:
                break
            shared += 1
        return sum(_prefix_tokens(x) for x in current[:shared])

    def output(self, answer: Answer, body: Any, n: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        encrypted = "reasoning.encrypted_content" in (body.get("include") or ())
        rid = f"rs_{n:04d}"
        if answer.thinking:
            item: dict[str, Any] = {
                "id": rid,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": answer.thinking}],
            }
            if encrypted:
                item["encrypted_content"] = self.signer.sign(rid)
            items.append(item)
        if answer.text:
            items.append(
                {
                    "id": f"msg_{n:04d}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer.text, "annotations": []}],
                }
            )
        for i, call in enumerate(answer.calls):
            fid = f"fc_{n:04d}_{i}"
            items.append(
                {
                    "id": fid,
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call.id or f"call_{n}_{i}",
                    "name": call.name,
                    "arguments": arguments_text(call),
                }
            )
            if answer.thinking:
                self.needs[fid] = rid
        if answer.thinking and len(items) > 1:
            self.follows[rid] = items[1]["id"]
        return items

    def usage(self, answer: Answer) -> dict[str, Any]:
        cached = answer.cached_tokens or self.cached_tokens
        return {
            "input_tokens": max(answer.prompt_tokens, cached),
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": answer.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
            "total_tokens": max(answer.prompt_tokens, cached) + answer.completion_tokens,
        }

    def response(self, answer: Answer, body: Any, n: int, output: list[Any]) -> dict[str, Any]:
        incomplete = answer.stop == "length"
        return {
            "id": f"resp_{n:04d}",
            "object": "response",
            "created_at": 1700000000,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "model": body["model"],
            "output": output,
            "store": False,
            "usage": self.usage(answer),
        }

    def whole(self, answer: Answer, body: Any, n: int) -> dict[str, Any]:
        return self.response(answer, body, n, self.output(answer, body, n))

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        output = self.output(answer, body, n)
        seq = iter(range(10_000))

        def event(kind: str, **data: Any) -> str:
            return sse({"type": kind, "sequence_number": next(seq), **data}, kind)

        start = {**self.response(answer, body, n, []), "status": "in_progress", "usage": None}
        out = [event("response.created", response=start)]
        for index, item in enumerate(output):
            kind = item["type"]
            if kind == "reasoning":
                opened = {**item, "summary": []}
                out.append(event("response.output_item.added", output_index=index, item=opened))
                for p in pieces(item["summary"][0]["text"]):
                    out.append(
                        event(
                            "response.reasoning_summary_text.delta",
                            item_id=item["id"],
                            output_index=index,
                            summary_index=0,
                            delta=p,
                        )
                    )
            elif kind == "message":
                opened = {**item, "status": "in_progress", "content": []}
                out.append(event("response.output_item.added", output_index=index, item=opened))
                text = item["content"][0]["text"]
                for p in pieces(text):
                    out.append(
                        event(
                            "response.output_text.delta",
                            item_id=item["id"],
                            output_index=index,
                            content_index=0,
                            delta=p,
                        )
                    )
                out.append(
                    event(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        text=text,
                    )
                )
            else:
                opened = {**item, "status": "in_progress", "arguments": ""}
                out.append(event("response.output_item.added", output_index=index, item=opened))
                for p in pieces(item["arguments"], 5):
                    out.append(
                        event(
                            "response.function_call_arguments.delta",
                            item_id=item["id"],
                            output_index=index,
                            delta=p,
                        )
                    )
                out.append(
                    event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=index,
                        arguments=item["arguments"],
                    )
                )
            out.append(event("response.output_item.done", output_index=index, item=item))
        final = self.response(answer, body, n, output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(event(kind, response=final))
        return out

    def stream_error(self, fault: StreamError) -> list[str]:
        return [
            sse(
                {
                    "type": "error",
                    "code": fault.code,
                    "message": fault.message,
                    "param": None,
                    "sequence_number": 999,
                },
                "error",
            )
        ]


REASONING_FAKES: dict[str, type[FakeProvider]] = {
    "anthropic": FakeThinkingAnthropic,
    "gemini": FakeThinkingGemini,
    "openai_responses": FakeResponses,
}
REASONING_PREFIXES = {"anthropic": "/v1", "gemini": "/v1beta", "openai_responses": "/v1"}
REASONING_MODELS = {
    "anthropic": "claude-sonnet-5-5",
    "gemini": "gemini-3-pro-preview",
    "openai_responses": "gpt-5-mini",
}


@asynccontextmanager
async def running_reasoning(
    provider: str,
    script: Sequence[Reply],
    *,
    fake_options: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Any, Any]]:
    """A reasoning fake for ``provider`` serving ``script`` and an adapter pointed at it."""
    from cantrip.llm import load_llm

    fake = REASONING_FAKES[provider](script, **(fake_options or {}))
    async with serve(fake, REASONING_PREFIXES[provider]) as url:
        options.setdefault("model", REASONING_MODELS[provider])
        llm = load_llm(provider, base_url=url, **options)
        try:
            yield fake, llm
        finally:
            await llm.aclose()
