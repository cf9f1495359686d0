"""``[memory] embedder = {...}``: a spec's memory searches by meaning (issue 42, item 6).

The embedder is built at load from the provider's TOML (one line per problem), and the
store a cast opens beside its loom embeds with it: what one session remembers in some
words, automatic recall in the next finds by meaning in others. On SQLite and
PostgreSQL, against the loopback fake of OpenAI's embeddings endpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_embeddings import FakeOpenAIEmbeddings
from fake_providers import isolate, serve

from cantrip import ConstructionError
from cantrip.loom import Loom
from cantrip.memory import memory_for

KEY = "sk-embed-secret-0123456789"

SPEC = """
[llm]
provider = "scripted"
script = "shared"
responses = [
  {{tool_calls = [{{gate = "remember", args = {{key = "family", value = "My spouse is Bob"}}}}]}},
  {{tool_calls = [{{gate = "done", args = {{answer = "noted"}}}}]}},
  {{tool_calls = [{{gate = "done", args = {{answer = "Bob"}}}}]}},
]

[circle]
medium = "conversation"
gates = ["done", "remember", "recall"]
wards = [{{max_turns = 5}}]

[loom]
{loom}

[memory]
namespace = ["user", "{{user}}"]
recall = true
recall_k = 1
embedder = {{ provider = "openai", model = "text-embedding-3-small", base_url = "{url}" }}
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_spec_embedder_makes_recall_find_by_meaning(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    target = str(tmp_path / "loom.db") if kind == "sqlite" else request.getfixturevalue("pg_url")
    loom_line = f'path = "{target}"' if kind == "sqlite" else f'url = "{target}"'
    fake = FakeOpenAIEmbeddings([], key=KEY)
    async with serve(fake, "/v1") as url:
        path = tmp_path / "helper.toml"
        path.write_text(SPEC.format(loom=loom_line, url=url))
        s = build_cantrip(load_spec_file(path), base_dir=tmp_path)
        assert s.memory is not None and s.memory.embedder is not None
        async with s.summon() as entity:
            first = await entity.send("Remember my family.", tags={"user": "alice"})
            assert first.result == "noted"
            embedded = len(fake.requests)
            assert embedded >= 1  # the put was embedded
            # no word in common with "My spouse is Bob" but the concept (partner)
            second = await entity.send("Who is my husband?", tags={"user": "alice"})
        assert second.result == "Bob"
        recalled = second.turns[0].extras["memory"]["recalled"]
        assert [r["key"] for r in recalled] == ["family"]
        assert len(fake.requests) > embedded  # the query was embedded too
        store = memory_for(s.loom.store)
        try:
            rows = store.search(("user", "alice"), query="Who is my husband?", limit=5)
            assert rows == []  # by words alone it is not found: meaning found it
        finally:
            store.close()
        s.loom.close()


@pytest.mark.parametrize(
    ("embedder", "expected"),
    [
        ('{ provider = "nope" }', "memory.embedder: unknown provider 'nope'"),
        ('{ provider = "anthropic" }', "memory.embedder: provider 'anthropic'"),
        (
            '{ provider = "openai", api_key_env = "NO_SUCH_KEY_VAR" }',
            "memory.embedder: provider 'openai' needs an API key: set the environment "
            "variable NO_SUCH_KEY_VAR",
        ),
        ('{ provider = "openai", dimensions = 0 }', "memory.embedder.dimensions"),
        ('{ provider = "openai", modle = "x" }', "unknown key 'memory.embedder.modle'"),
    ],
)
def test_spec_embedder_mistakes_are_one_line_each_at_load(
    tmp_path: Path, embedder: str, expected: str
) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    text = SPEC.format(loom='path = "loom.db"', url="http://127.0.0.1:9/v1").replace(
        'embedder = { provider = "openai", model = "text-embedding-3-small", '
        'base_url = "http://127.0.0.1:9/v1" }',
        f"embedder = {embedder}",
    )
    path = tmp_path / "helper.toml"
    path.write_text(text)
    with pytest.raises(ConstructionError) as caught:
        build_cantrip(load_spec_file(path), base_dir=tmp_path)
    problems = caught.value.problems
    assert len(problems) == 1, problems
    assert expected in problems[0]
    assert "\n" not in problems[0]
    assert KEY not in problems[0]


def test_memory_without_an_embedder_still_loads(tmp_path: Path) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    text = SPEC.format(loom='path = "loom.db"', url="x").split("embedder =")[0]
    path = tmp_path / "helper.toml"
    path.write_text(text)
    s = build_cantrip(load_spec_file(path), base_dir=tmp_path)
    assert s.memory is not None and s.memory.embedder is None
    assert isinstance(s.loom, Loom)
    s.loom.close()
