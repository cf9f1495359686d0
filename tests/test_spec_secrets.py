"""Credentials in a spec (issue 39.8): one check for every table that carries them.

An A2A agent's ``headers`` take the ``${NAME}`` form an MCP server's ``env`` and
``headers`` take, and a spec queued for workers is refused when any of them holds a
literal value -- by the one check in :mod:`cantrip.distributed._spell_secrets`, which
reads the one list of tables that carry credentials. (The whole path, with PostgreSQL, a
worker and a real A2A agent, is tests/test_db_secrets.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest

from cantrip import ConstructionError
from cantrip._redact import redact
from cantrip.a2a import A2AAgent
from cantrip.distributed._spell_secrets import check_queued_spell
from cantrip.spec import CREDENTIAL_FIELDS, A2ATable, CircleSpec, MCPTable

SECRET = "literal-bearer-5521-zz"


def queued(**circle: Any) -> dict[str, Any]:
    return {"spec": {"llm": {"provider": "scripted"}, "circle": circle}, "base_dir": "/x"}


def agent(**headers: Any) -> dict[str, Any]:
    return {"name": "travel", "url": "https://agents.example/travel", "headers": headers}


def test_a_literal_a2a_header_is_refused_naming_table_and_key_not_value() -> None:
    with pytest.raises(ConstructionError) as raised:
        check_queued_spell(queued(a2a=[agent(Authorization=f"Bearer {SECRET}")]))
    assert str(raised.value) == (
        "circle.a2a[0].headers.Authorization: a spec run by workers is stored in the "
        'database, so give headers values as variables ("${NAME}") that each worker reads '
        "from its own environment, not as literal values"
    )
    assert SECRET not in repr(raised.value) and SECRET not in str(raised.value.problems)


def test_every_literal_of_every_table_is_reported_at_once() -> None:
    server = {"name": "box", "command": "x", "env": {"A": "${OK}", "B": SECRET}}
    spell = queued(
        mcp=[server],
        a2a=[agent(Authorization="Bearer ${TRAVEL_TOKEN}"), agent(**{"X-Key": 12345678})],
    )
    with pytest.raises(ConstructionError) as raised:
        check_queued_spell(spell)
    assert [p.split(":")[0] for p in raised.value.problems] == [
        "circle.mcp[0].env.B",
        "circle.a2a[1].headers.X-Key",
    ]
    assert SECRET not in str(raised.value) and "12345678" not in str(raised.value)


def test_a_single_table_instead_of_an_array_is_checked_too() -> None:
    """``[circle.a2a]`` (one table, not ``[[circle.a2a]]``) is a spec error the worker
    reports -- after the spell was stored, so its values are checked here all the same."""
    with pytest.raises(ConstructionError, match=r"circle\.a2a\.headers\.Authorization"):
        check_queued_spell(queued(a2a=agent(Authorization=SECRET)))
    with pytest.raises(ConstructionError, match=r"^circle\.a2a\[0\]\.headers: a spec run") as one:
        check_queued_spell(queued(a2a=[{"name": "t", "url": "https://x", "headers": SECRET}]))
    assert SECRET not in str(one.value)
    with pytest.raises(ConstructionError, match="headers must be a table of names and values"):
        check_queued_spell(queued(a2a=[{"name": "t", "url": "https://x", "headers": [SECRET]}]))


def test_references_pass() -> None:
    check_queued_spell(queued(a2a=[agent(Authorization="Bearer ${TRAVEL_TOKEN}")]))
    check_queued_spell(queued(a2a=[{"name": "t", "url": "https://x"}]))
    check_queued_spell({"factory": "somewhere:spell"})


def test_an_a2a_header_reference_resolves_where_the_agent_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRAVEL_TOKEN_UNSET", raising=False)
    monkeypatch.setenv("TRAVEL_TOKEN_39", "resolved-travel-token-39")
    travel = A2AAgent(
        name="travel",
        url="https://agents.example/travel",
        headers={"Authorization": "Bearer ${TRAVEL_TOKEN_39}", "X-Other": "${TRAVEL_TOKEN_UNSET}"},
    )
    with pytest.raises(ConstructionError) as raised:
        travel.resolved()
    assert str(raised.value) == (
        "A2A agent 'travel': headers.X-Other names ${TRAVEL_TOKEN_UNSET}, which is not set "
        "in this process's environment"
    )
    monkeypatch.setenv("TRAVEL_TOKEN_UNSET", "set-now-7781")
    assert dict(travel.resolved().headers) == {
        "Authorization": "Bearer resolved-travel-token-39",
        "X-Other": "set-now-7781",
    }
    assert dict(travel.headers)["Authorization"] == "Bearer ${TRAVEL_TOKEN_39}", "unchanged"
    assert redact("resolved-travel-token-39") == "[REDACTED]", "a named variable is a secret"


def test_the_one_list_knows_every_provider_table_and_every_credential_field() -> None:
    """A new ``[[circle.X]]`` provider table, or a new table of names and values in one
    (where headers and an environment go), or a field named like a credential (a
    token, a key, a password), fails here until it is listed in
    CREDENTIAL_FIELDS -- and so checked before a spec is queued."""
    tables = {
        name
        for name, field in CircleSpec.model_fields.items()
        # wards are limits; guardrail tables name checks (a classifier names an [llms]
        # entry, whose key comes from the environment like any LLM's): no credentials
        if field.annotation == list[dict[str, Any]] and name not in ("wards", "guardrails")
    }
    assert tables == set(CREDENTIAL_FIELDS)
    credential_names = re.compile(r"env|header|token|secret|password|key|auth|cred", re.I)
    for key, model in {"mcp": MCPTable, "a2a": A2ATable}.items():
        carrying = {
            name
            for name, f in model.model_fields.items()
            if f.annotation == dict[str, str] or credential_names.search(name)
        }
        assert carrying == set(CREDENTIAL_FIELDS[key]), key


def test_a_listed_field_may_be_a_single_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """A future table whose credential is one value (``token = "..."``), once listed, is
    checked like a table of them."""
    import cantrip.distributed._spell_secrets as spell_secrets

    monkeypatch.setattr(spell_secrets, "CREDENTIAL_FIELDS", {"future": ("token",)})
    with pytest.raises(ConstructionError) as raised:
        check_queued_spell(queued(future=[{"token": SECRET}, {"token": "${FUTURE_TOKEN}"}]))
    assert [p.split(":")[0] for p in raised.value.problems] == ["circle.future[0].token"]
    assert SECRET not in str(raised.value)
