"""Issue 21: secrets never leave -- not through serve, not through the loom file.

An attacker's provider quotes the API key back in its error body ("Incorrect
API key provided: <KEY>"), as OpenAI's API does for a wrong key
(https://platform.openai.com/docs/guides/error-codes -- 401 "Incorrect API key
provided"). The key used here has no credential *shape*, so only the
redactor's knowledge of the environment can catch it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from fake_providers import Answer, Call, FakeOpenAI, Request, Sender, serve
from hypothesis import given, settings
from hypothesis import strategies as st

from cantrip.protocols.http._serve import serve_http
from cantrip.spec import build_cantrip, load_spec_file

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
KEY = "plain-provider-secret-0042-zz"
"""No known credential shape: only the environment tells the redactor it is secret."""


class QuotingOpenAI(FakeOpenAI):
    """An OpenAI-style server that, like the real one, quotes a wrong key in its 401."""

    async def respond(self, request: Request, send: Sender) -> None:
        if not self.check_auth(request):
            self.requests.append(request)
            sent = request.headers.get("authorization", "").removeprefix("Bearer ")
            await send.json(
                401,
                self.error_body(401, f"Incorrect API key provided: {sent}.", "invalid_api_key"),
            )
            return
        await super().respond(request, send)


def spec_text(base_url: str, env: str, loom: str = "loom.db") -> str:
    return (
        f'[llm]\nprovider = "openai"\nmodel = "gpt-4o-mini"\nbase_url = "{base_url}"\n'
        f'api_key_env = "{env}"\n'
        '[circle]\nmedium = "conversation"\ngates = ["done", "echo"]\nwards = [{max_turns = 3}]\n'
        f'[retry]\nmax_retries = 0\n[loom]\npath = "{loom}"\n'
    )


@asynccontextmanager
async def quoting_provider() -> AsyncIterator[str]:
    fake = QuotingOpenAI([Answer(calls=(Call("done", {"answer": "ok"}),))], key="the-right-key")
    async with serve(fake, "/v1") as url:
        yield url


def isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_KEY", "_TOKEN"))}
    env["CANTRIP_PROVIDERS_DIR"] = str(tmp_path / "no-user-providers")
    env.update(extra)
    return env


def every_byte(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


# -- 1. serve's error paths --------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_serve_never_sends_a_key_the_provider_quotes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.setenv("LLM_CRED", KEY)  # a name no heuristic would guess
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(tmp_path / "none"))
    async with quoting_provider() as url:
        spec = tmp_path / "spec.toml"
        spec.write_text(spec_text(url, "LLM_CRED"))
        spell = build_cantrip(load_spec_file(spec), base_dir=tmp_path)
        try:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(serve_http, spell, "127.0.0.1", 0)
                async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:
                    sid = (await http.post("/sessions")).json()["session_id"]
                    if stream:
                        response = await http.post(
                            f"/sessions/{sid}/prompt?stream=1", json={"prompt": "hi"}
                        )
                        assert "event: error" in response.text
                    else:
                        response = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "hi"})
                        assert response.status_code == 500
                        assert response.json()["error"]["code"] == "cast_failed"
                    thread = await http.get(f"/sessions/{sid}/thread")
                nursery.cancel_scope.cancel()
        finally:
            spell.loom.close()
    assert "Incorrect API key provided" in response.text, "the error itself is reported"
    assert KEY not in response.text and "[REDACTED]" in response.text
    assert KEY not in thread.text
    assert KEY.encode() not in every_byte(tmp_path), "nor does the loom file keep it"


# -- 2 + 3. a custom key variable, and a later process exporting the loom ----------------


@pytest.mark.parametrize("variable", ["MY_PROVIDER_KEY", "LLM_CRED"])
async def test_a_later_export_by_another_process_cannot_leak_the_key(
    tmp_path: Path, variable: str
) -> None:
    async with quoting_provider() as url:
        (tmp_path / "spec.toml").write_text(spec_text(url, variable))
        cast = await trio.run_process(
            [CANTRIP, "cast", str(tmp_path / "spec.toml"), "hello"],
            env=isolated_env(tmp_path, **{variable: KEY}),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert cast.returncode == 1
    assert b"Incorrect API key provided" in cast.stderr and KEY.encode() not in cast.stderr
    loom = tmp_path / "loom.db"
    assert loom.exists()
    # every byte of every store file (database, WAL, shared memory)
    assert KEY.encode() not in every_byte(tmp_path)
    # a later process that knows nothing of the variable: the default export is clean
    for raw in ([], ["--raw"]):
        export = subprocess.run(
            [CANTRIP, "loom", str(loom), "export", *raw],
            env=isolated_env(tmp_path),
            capture_output=True,
            check=True,
        )
        assert KEY.encode() not in export.stdout + export.stderr
    recorded = [json.loads(line) for line in export.stdout.splitlines()]
    assert any("[REDACTED]" in json.dumps(r) for r in recorded), "the error turn is recorded"


def test_every_variable_a_loaded_provider_config_names_is_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cantrip import _redact
    from cantrip.llm import clear_cache
    from cantrip.llm._config import load_provider_config

    folder = tmp_path / "providers"
    folder.mkdir()
    (folder / "acme.toml").write_text(
        '[provider]\nadapter = "openai"\napi_format = "openai-chat"\n'
        'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "ACME_CRED"\n'
    )
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(folder))
    monkeypatch.setenv("ACME_CRED", KEY)
    monkeypatch.setattr(_redact, "KEY_ENV_VARS", set(_redact.KEY_ENV_VARS))
    clear_cache()
    assert KEY in _redact.redact(f"quoted {KEY}"), "not known before the config is loaded"
    load_provider_config("acme")  # loaded, never used to build an LLM
    assert _redact.redact(f"quoted {KEY}") == "quoted [REDACTED]"
    clear_cache()


def test_variables_named_like_secrets_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    from cantrip._redact import redact

    monkeypatch.setenv("SOME_SERVICE_TOKEN", "abcdefgh-ijkl")
    monkeypatch.setenv("WIDGET_API_KEY", "zyxwvut-98765")
    monkeypatch.setenv("SHORT_TOKEN", "1234")  # too short to guess at
    text = redact("abcdefgh-ijkl zyxwvut-98765 1234")
    assert text == "[REDACTED] [REDACTED] 1234"


def test_redacting_a_value_redacts_every_string_in_it_as_redact_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``redact_value`` looks the secrets up once per value: each string inside still
    comes out exactly as ``redact`` gives it, keys and non-strings untouched."""
    from cantrip._redact import redact, redact_value

    monkeypatch.setenv("SOME_SERVICE_TOKEN", "abcdefgh-ijkl")
    strings = ["abcdefgh-ijkl", "key sk-abcdefghijklmnopqrstuvwx here", "plain", ""]
    value = {"a": strings[0], "b": [strings[1], {"c": (strings[2], 7, None)}], "d": strings[3]}
    assert redact_value(value) == {
        "a": redact(strings[0]),
        "b": [redact(strings[1]), {"c": [redact(strings[2]), 7, None]}],
        "d": "",
    }
    assert redact_value(value)["a"] == "[REDACTED]" and "sk-" not in redact_value(value)["b"][0]
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "changed-value-1")  # read afresh per call
    assert redact_value({"x": "changed-value-1"}) == {"x": "[REDACTED]"}


def _secrets_from_scratch(environ: Mapping[str, str]) -> set[str]:
    """What the environment's secrets are by the rules, without any cache."""
    from cantrip._redact import _MIN_GUESSED, _SECRET_NAME, KEY_ENV_VARS

    found = set()
    for name, raw in environ.items():
        value = raw.strip()
        named = name in KEY_ENV_VARS and len(value) >= 6
        if named or (len(value) >= _MIN_GUESSED and _SECRET_NAME.search(name)):
            found.add(value)
    return found


_ENV_NAMES = ["CANTRIP_TEST_API_KEY", "CANTRIP_TEST_PLAIN", "OPENAI_API_KEY", "X_SECRET"]
_ENV_VALUES = ["sekrit-value-1", "sekrit-value-22", "short", "  padded-secret-3  ", ""]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "delete", "replace mapping", "restore mapping"]),
            st.sampled_from(_ENV_NAMES),
            st.sampled_from(_ENV_VALUES),
        ),
        max_size=12,
    )
)
@settings(max_examples=300, deadline=None)
def test_the_secrets_follow_every_change_to_the_environment(
    steps: list[tuple[str, str, str]],
) -> None:
    """Differential: after each write to the environment (set, replaced in place,
    deleted; also with ``os.environ`` replaced by a plain mapping, as a test's patch
    does, and put back), the cached secrets are exactly those computed from scratch,
    the cache having been consulted before every step."""
    from cantrip._redact import secret_values

    real = os.environ
    saved = {name: real.get(name) for name in _ENV_NAMES}
    try:
        for action, name, value in steps:
            assert set(secret_values()) == _secrets_from_scratch(os.environ)
            if action == "set":
                os.environ[name] = value
            elif action == "delete":
                os.environ.pop(name, None)
            elif action == "replace mapping":
                os.environ = dict(os.environ)  # type: ignore[assignment]  # noqa: B003 (a patch)
            else:
                os.environ = real  # noqa: B003 (the real one, back)
            assert set(secret_values()) == _secrets_from_scratch(os.environ)
    finally:
        os.environ = real  # noqa: B003
        for name, old in saved.items():
            if old is None:
                real.pop(name, None)
            else:
                real[name] = old


_FRAGMENTS = [
    *("sk-", "SK-", "proj-", "AIza", "aiza", "ghp_", "GHS_", "github_pat_", "AKIA", "ASIA"),
    *("xoxb-", "XOX", "Bearer ", "bearer\t", "api_key", "API-KEY", "apikey", "secret", "Token"),
    *("password", "passwd", "aws_secret_access_key", "=", ": ", "'", '"', "\\", " ", "\n"),
    *("abcdefghij", "0123456789ABCDEF", "_", "-", "é", "\u0130", "\u0131", "\u017f"),
    *("\u212a", "\u017fecret=", "to\u212aen: ", "ap\u0131key=", "PA\u017f\u017fWORD="),
]


@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=30).map("".join) | st.text(max_size=80))
@settings(max_examples=2000, deadline=None)
def test_the_quick_check_before_the_shape_scan_changes_no_answer(text: str) -> None:
    """The shape scan runs only on text that holds a shape's literal part in some case
    (``_may_hold_shape``, a speed-up): on texts built from the shapes' pieces, mixed
    case, and the non-ASCII letters case-insensitive matching equates with ASCII ones,
    redaction answers exactly what the full scan answers."""
    from cantrip._redact import _PATTERN, REDACTED, _redact_with

    assert _redact_with(text, []) == _PATTERN.sub(REDACTED, text)


def test_no_text_shorter_than_the_shortest_shape_can_hold_one() -> None:
    """``_may_hold_shape`` answers "no" for text shorter than ``_SHORTEST`` without
    looking at it: the bound is the shortest match the pattern's parse allows (each
    element, case-folded or not, matches exactly one character)."""
    from re import _parser  # type: ignore[attr-defined]

    from cantrip._redact import _PATTERN, _SHORTEST

    assert _parser.parse(_PATTERN.pattern).getwidth()[0] == _SHORTEST
    assert _PATTERN.fullmatch("sk-" + "a" * (_SHORTEST - 3))


@given(
    st.lists(st.sampled_from(_FRAGMENTS), max_size=6).map("".join).map(lambda t: t[:14])
    | st.text(alphabet="abcdefghijklmnopqrstuvwxyzKASIX_-=: 0123456789\u017f\u212a", max_size=14)
)
@settings(max_examples=2000, deadline=None)
def test_the_quick_check_answers_as_the_scan_on_short_text(text: str) -> None:
    """Short texts (ids, names: what a span carries) around the length bound, built
    from the shapes' pieces: the quick check never says "no shape" where the full scan
    finds one."""
    from cantrip._redact import _PATTERN, _may_hold_shape

    if _PATTERN.search(text):
        assert _may_hold_shape(text)


def test_the_letters_case_insensitive_matching_folds_to_ascii_are_all_known() -> None:
    """``_may_hold_shape`` scans in full any text holding a non-ASCII letter that the
    pattern's case-insensitive parts take for an ASCII one: the list must be whole on
    this Python (a new Unicode version could add one)."""
    from cantrip._redact import _FOLDS_TO_ASCII

    ascii_letter = re.compile("(?i)[a-z]")
    folding = {chr(c) for c in range(128, sys.maxunicode + 1) if ascii_letter.fullmatch(chr(c))}
    assert folding == set(_FOLDS_TO_ASCII)


# -- 6. file gates cannot read the loom or the spec ---------------------------------------

READS = ["notes.txt", "loom.db", "loom.db-wal", "./loom.db-shm", "spec.toml", "other.db"]


def reading_spec(folder: Path, hidden: str = "") -> Path:
    calls = ", ".join(f'{{ gate = "read", args = {{ path = "{p}" }} }}' for p in READS)
    dependencies = f'{{ root = "."{hidden} }}'
    spec = folder / "spec.toml"
    spec.write_text(
        f'[llm]\nprovider = "scripted"\nresponses = [{{ tool_calls = [{calls}] }},\n'
        '  { tool_calls = [{ gate = "done", args = { answer = "read" } }] }]\n'
        '[circle]\nmedium = "conversation"\n'
        f'gates = ["done", {{ name = "read", dependencies = {dependencies} }}]\n'
        'wards = [{ max_turns = 3 }]\n[loom]\npath = "loom.db"\n'
    )
    return spec


async def read_results(spec: Path) -> dict[str, str]:
    import sqlite3

    folder = spec.parent
    (folder / "notes.txt").write_text("plain notes")
    other = sqlite3.connect(folder / "other.db")  # another loom: other sessions' transcripts
    other.execute("CREATE TABLE turns (data TEXT)")
    other.commit()
    other.close()
    spell = build_cantrip(load_spec_file(spec), base_dir=folder)
    try:
        outcome = await spell.cast_async("Read everything")
    finally:
        spell.loom.close()
    records = outcome.turns[0].gate_calls
    return {
        path: ("ERROR " if r.is_error else "") + r.text
        for path, r in zip(READS, records, strict=True)
    }


async def test_the_read_gate_cannot_open_the_loom_its_journals_or_the_spec(
    tmp_path: Path,
) -> None:
    seen = await read_results(reading_spec(tmp_path))
    assert seen["notes.txt"] == "plain notes"
    for hidden in ("loom.db", "loom.db-wal", "./loom.db-shm", "spec.toml"):
        assert seen[hidden].startswith("ERROR ENOENT"), (hidden, seen[hidden])
    assert "is a database" in seen["other.db"]


async def test_a_spec_can_override_what_is_hidden(tmp_path: Path) -> None:
    seen = await read_results(reading_spec(tmp_path, ', hidden = ["notes.txt"]'))
    assert seen["notes.txt"].startswith("ERROR ENOENT")
    assert "[llm]" in seen["spec.toml"], "the spec chose to show itself"
    assert "is a database" in seen["loom.db"], "a database is never read as text"


# -- 7. the (non-isolated) bash medium can read the host's environment ----------------------

BASH_PROBE = r"""submit_answer "$(tr '\0' '\n' < /proc/$PPID/environ | grep '^PROBE_VALUE=')" """


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_the_docs_state_that_bash_can_read_the_hosts_environment(tmp_path: Path) -> None:
    """The documented risk is real: bash's scrubbed environment does not stop it from
    reading the cantrip process's own through ``/proc/$PPID/environ``."""
    spec = tmp_path / "bash.toml"
    spec.write_text(
        f"[llm]\nprovider = \"scripted\"\nresponses = [{{ code = '''{BASH_PROBE}''' }}]\n"
        '[circle]\nmedium = "bash"\ngates = ["done"]\nwards = [{ max_turns = 2 }]\n'
    )
    done = subprocess.run(
        [CANTRIP, "cast", str(spec), "leak it"],
        env={**isolated_env(tmp_path), "PROBE_VALUE": "visible-to-bash-4711"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "PROBE_VALUE=visible-to-bash-4711", done.stderr
    readme = (Path(__file__).resolve().parents[1] / "docs/how-to/code-mediums.md").read_text()
    bash_row = next(line for line in readme.splitlines() if line.startswith("| `bash`"))
    assert "/proc/$PPID/environ" in bash_row, "the docs' bash row names this exact risk"


# -- issue 28.1: OpenTelemetry traces never carry a key ----------------------------------


class RepeatingOpenAI(QuotingOpenAI):
    """Quotes the key a dozen times in a row: wherever a length cut falls inside the
    quoted text, it leaves part of a key behind unless redaction came first."""

    async def respond(self, request: Request, send: Sender) -> None:
        self.requests.append(request)
        sent = request.headers.get("authorization", "").removeprefix("Bearer ")
        message = f"Incorrect API key provided: {sent * 12}."
        await send.json(401, self.error_body(401, message, "invalid_api_key"))


def key_pieces(data: bytes, key: str = KEY, size: int = 10) -> list[str]:
    """Every run of ``size`` characters of ``key`` that ``data`` holds (a partial key)."""
    return [
        key[i : i + size] for i in range(len(key) - size + 1) if key[i : i + size].encode() in data
    ]


@pytest.mark.parametrize("capture", [False, True])
async def test_otlp_traces_never_carry_a_key_the_provider_quotes(
    tmp_path: Path, capture: bool
) -> None:
    """Issue 28.1: `cast --otlp` into a real OTLP/HTTP receiver; the provider's 401 quotes
    the key, which ends up in the `chat` span's error status (cut at 200 characters)."""
    from otlp_receiver import otlp_receiver

    fake = RepeatingOpenAI([], key="the-right-key")
    async with serve(fake, "/v1") as url, otlp_receiver() as (otlp, received):
        (tmp_path / "spec.toml").write_text(spec_text(url, "LLM_CRED"))
        env = isolated_env(tmp_path, LLM_CRED=KEY, PYTHONPATH=str(Path(__file__).parents[1]))
        env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true" if capture else ""
        cast = await trio.run_process(
            [CANTRIP, "cast", "--otlp", otlp, str(tmp_path / "spec.toml"), "hello"],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert cast.returncode == 1, cast.stderr.decode()
    assert b"Incorrect API key provided" in cast.stderr  # what the user sees, redacted
    assert KEY.encode() not in cast.stderr
    chat = [s for s in received.spans() if s.name.startswith("chat")]  # type: ignore[attr-defined]
    assert chat and "Incorrect API key provided: [REDACTED]" in chat[0].status.message
    assert KEY.encode() not in received.raw
    assert key_pieces(received.raw) == [], "no piece of a key left by a length cut"
