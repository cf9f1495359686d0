"""Loopback servers speaking each embeddings wire format, and a deterministic embedding.

:class:`FakeOpenAIEmbeddings` answers ``POST /v1/embeddings`` and
:class:`FakeGeminiEmbeddings` ``POST /v1beta/models/{model}:embedContent`` and
``:batchEmbedContents``, on the trio servers of :mod:`fake_providers` (127.0.0.1, an
ephemeral port). Each checks a request the way its service documents and refuses
what the service refuses with the service's own 400 (OpenAI: an ``input`` array of
at most 2,048 strings, none empty; ``encoding_format`` ``float`` or ``base64``;
``dimensions`` only for the models that take it and no larger than theirs; no
unknown field. Gemini: ``content.parts[].text``, a known ``taskType``, at most 100
requests a batch, each naming the URL's model; no unknown field), and answers in
its shape (``data[].index/embedding`` + ``usage``; ``embedding.values`` /
``embeddings[].values``). Script entries (:class:`fake_providers.Fault`,
``Malformed``, ``Raw``) are served first, one per request; then real answers.

:func:`meaning` is the embedding both fakes compute: words mapped to concepts by a
small synonym table (``car``/``automobile``/``vehicle`` are one concept), each
concept hashed to four dimensions and signs, the sum scaled to length 1. Two texts
with the same concepts in other words get the same vector; texts with none in
common are near orthogonal -- a paraphrase is found by meaning and missed by words.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from collections.abc import Sequence
from typing import Any

from fake_providers import FakeGemini, FakeOpenAI, Fault, Malformed, Raw, Rejected, Request, Sender

NATIVE = 64
"""Dimensions of the fake models' vectors (before ``dimensions`` shortens them)."""
SYNONYMS = {
    "automobile": "car",
    "vehicle": "car",
    "drives": "car",
    "driving": "car",
    "physician": "doctor",
    "medic": "doctor",
    "feline": "cat",
    "kitten": "cat",
    "canine": "dog",
    "puppy": "dog",
    "spouse": "partner",
    "wife": "partner",
    "husband": "partner",
    "allergic": "allergy",
    "peanuts": "peanut",
    "nuts": "peanut",
}
STOP = {"a", "an", "the", "to", "of", "is", "and", "my", "her", "his", "has", "with", "in", "on"}
_WORD = re.compile(r"[a-z]+")


def concepts(text: str) -> list[str]:
    return [SYNONYMS.get(w, w) for w in _WORD.findall(text.lower()) if w not in STOP]


def meaning(text: str, dimensions: int = NATIVE) -> list[float]:
    """The fake models' embedding of ``text`` (see the module docstring)."""
    vector = [0.0] * dimensions
    for concept in concepts(text) or ["<empty>"]:
        digest = hashlib.sha256(concept.encode()).digest()
        for k in range(4):  # four slots a concept: one collision leaves most of it apart
            slot = int.from_bytes(digest[4 * k : 4 * k + 4], "little") % dimensions
            vector[slot] += 1.0 if digest[16 + k] % 2 else -1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


class _Embeddings:
    """What both fakes share: scripted faults first, then answers."""

    def __init__(self, script: Sequence[Any] = (), *, key: str = "test-key") -> None:
        super().__init__(script, key=key)  # type: ignore[call-arg]

    async def respond(self, request: Request, send: Sender) -> None:
        fake: Any = self
        fake.requests.append(request)
        if not fake.check_auth(request):
            await send.json(401, fake.error_body(401, "invalid api key", "invalid_api_key"))
            return
        try:
            body = request.json()
            answer = fake.answer(request, body)
        except ValueError:
            await send.json(400, fake.error_body(400, "body is not JSON", None))
            return
        except Rejected as exc:
            await send.json(400, fake.error_body(400, str(exc), "invalid_request_error"))
            return
        if fake.script:
            reply = fake.script.pop(0)
            if isinstance(reply, Fault):
                message = fake.error_body(reply.status, reply.message, reply.code)
                await send.json(reply.status, message, reply.headers)
            elif isinstance(reply, Malformed):
                await send.raw(200, reply.body, {"content-type": "application/json"})
            elif isinstance(reply, Raw):
                await send.raw(reply.status, reply.body, reply.headers)
            else:
                raise AssertionError(f"not an embeddings script entry: {reply!r}")
            return
        fake.served += 1
        await send.json(200, answer)


class FakeOpenAIEmbeddings(_Embeddings, FakeOpenAI):
    MAX_INPUTS = 2048
    SHORTENS = ("text-embedding-3-small", "text-embedding-3-large")
    FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}

    def answer(self, request: Request, body: Any) -> dict[str, Any]:
        if request.path != "/v1/embeddings":
            raise Rejected(f"unknown path {request.path}")
        if not isinstance(body, dict):
            raise Rejected("the body is a JSON object")
        unknown = sorted(set(body) - self.FIELDS)
        if unknown:
            raise Rejected(f"Unrecognized request argument supplied: {unknown[0]}")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise Rejected("you must provide a model parameter")
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts:
            raise Rejected("'$.input' is invalid: a string or an array of strings")
        if len(texts) > self.MAX_INPUTS:
            raise Rejected(f"'$.input' is invalid: at most {self.MAX_INPUTS} inputs per request")
        if any(not isinstance(t, str) or not t for t in texts):
            raise Rejected("'$.input' is invalid: every input is a non-empty string")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise Rejected("encoding_format is 'float' or 'base64'")
        size = body.get("dimensions", NATIVE)
        if "dimensions" in body:
            if model not in self.SHORTENS:
                raise Rejected(f"This model does not support specifying dimensions: {model}")
            if not isinstance(size, int) or not 1 <= size <= NATIVE:
                raise Rejected(f"dimensions must be between 1 and {NATIVE}")
        data = []
        for index, text in enumerate(texts):
            vector = meaning(text, size)
            value: Any = vector
            if encoding == "base64":
                value = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": value})
        tokens = sum(len(t.split()) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


class FakeGeminiEmbeddings(_Embeddings, FakeGemini):
    MAX_BATCH = 100
    TASKS = {
        "TASK_TYPE_UNSPECIFIED",
        "RETRIEVAL_QUERY",
        "RETRIEVAL_DOCUMENT",
        "SEMANTIC_SIMILARITY",
        "CLASSIFICATION",
        "CLUSTERING",
        "QUESTION_ANSWERING",
        "FACT_VERIFICATION",
        "CODE_RETRIEVAL_QUERY",
    }
    FIELDS = {"model", "content", "taskType", "title", "outputDimensionality"}
    _EMBED = re.compile(r"^/v1beta/models/([^/:]+):(embedContent|batchEmbedContents)$")

    def answer(self, request: Request, body: Any) -> dict[str, Any]:
        match = self._EMBED.match(request.path)
        if match is None:
            raise Rejected(f"unknown path {request.path}")
        model = match.group(1)
        if match.group(2) == "embedContent":
            return {"embedding": self._one(body, model, "")}
        if set(body) != {"requests"} or not isinstance(body["requests"], list):
            raise Rejected("Invalid JSON payload received: expected only 'requests'")
        requests = body["requests"]
        if not requests:
            raise Rejected("* BatchEmbedContentsRequest.requests: must not be empty")
        if len(requests) > self.MAX_BATCH:
            raise Rejected(f"* BatchEmbedContentsRequest.requests: at most {self.MAX_BATCH}")
        out = []
        for n, entry in enumerate(requests):
            if not isinstance(entry, dict) or entry.get("model") != f"models/{model}":
                raise Rejected(
                    f"* BatchEmbedContentsRequest.requests[{n}].model: the model of each "
                    f"request must be the batch's (models/{model})"
                )
            out.append(self._one(entry, model, f"requests[{n}]."))
        return {"embeddings": out}

    def _one(self, body: Any, model: str, where: str) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Rejected("Invalid JSON payload received: an object")
        unknown = sorted(set(body) - self.FIELDS)
        if unknown:
            raise Rejected(f'Invalid JSON payload received. Unknown name "{unknown[0]}"')
        parts = (body.get("content") or {}).get("parts")
        if not isinstance(parts, list) or not parts:
            raise Rejected(f"* {where}content.parts: must not be empty")
        texts = [p.get("text") for p in parts if isinstance(p, dict)]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise Rejected(f"* {where}content.parts[].text: only text parts are embedded")
        task = body.get("taskType", "TASK_TYPE_UNSPECIFIED")
        if task not in self.TASKS:
            raise Rejected(f"Invalid value at '{where}task_type', \"{task}\"")
        if "title" in body and task != "RETRIEVAL_DOCUMENT":
            raise Rejected("title is only for taskType RETRIEVAL_DOCUMENT")
        size = body.get("outputDimensionality", NATIVE)
        if not isinstance(size, int) or not 1 <= size <= NATIVE:
            raise Rejected(f"* {where}output_dimensionality: between 1 and {NATIVE}")
        return {"values": meaning(" ".join(texts), size)}
