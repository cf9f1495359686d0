"""What the declarations of MCP servers and A2A agents share: the name rule, the
tables of strings (``env``, ``headers``) and the ``${NAME}`` form that keeps a
credential out of them.

An MCP server's ``env`` and ``headers`` and an A2A agent's ``headers`` are where a spec
(or a program) puts credentials (a token in ``Authorization``, a key in a server's
environment). Each value may name environment variables, ``"${NAME}"`` (alone or inside
text: ``"Bearer ${API_TOKEN}"``), read by the process that opens the server or agent --
as a provider's key travels as the name in ``api_key_env``, never as the key. Each
declaration resolves its references with :func:`resolve_references` when it is opened.
A spec run by workers must give every such value that way: the tables that carry them
are listed in :data:`CREDENTIAL_FIELDS` (here, below the spec layer that reads the
tables, so the queue's check costs no import of it), and the workers' queue refuses a
literal one (:mod:`cantrip.distributed._spell_secrets`).

This module sits below the declarations (:mod:`cantrip.mcp._provider`,
:mod:`cantrip.a2a._provider`) and the spec layer that reads their tables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cantrip._errors import ConstructionError
from cantrip._redact import register_secret_env

PROVIDER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
"""What an MCP server's or A2A agent's ``name`` may be."""

CREDENTIAL_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "mcp": ("env", "headers"),
        "a2a": ("headers",),
    }
)
"""``[[circle.KEY]]`` tables, and their fields whose values may be credentials (each
must then name variables, ``"${NAME}"``, in a spec run by workers). A new table that
carries any (headers, an environment, tokens) is listed here, and is then checked like
these: tests/test_spec_secrets.py fails for a circle table it does not know."""

REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``${NAME}``: an environment variable, read by the process that opens the provider."""


def string_table(value: Mapping[str, Any] | None) -> Mapping[str, str]:
    """``env``/``headers`` as an immutable table of strings (the attrs converter)."""
    return MappingProxyType({str(k): str(v) for k, v in (value or {}).items()})


def resolve_references(
    owner: str, fields: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """``fields`` (field -> {key: value}) with every ``${NAME}`` replaced by the variable's
    value in this process; each name becomes a known secret (redacted everywhere). One
    unset variable is a :class:`ConstructionError` naming every one, and ``owner``."""
    missing: list[str] = []
    out: dict[str, dict[str, str]] = {}
    for field, values in fields.items():
        resolved: dict[str, str] = {}
        for key, value in values.items():
            for name in REFERENCE.findall(value):
                register_secret_env(name)
                if name not in os.environ:
                    missing.append(f"{field}.{key} names ${{{name}}}")
            resolved[key] = REFERENCE.sub(lambda m: os.environ.get(m.group(1), ""), value)
        out[field] = resolved
    if missing:
        raise ConstructionError(
            f"{owner}: {', '.join(missing)}, which is not set in this process's environment"
        )
    return out


def url_without_secrets(url: str) -> str:
    """A URL without query or user info (either may carry a token)."""
    base = url.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = base.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"
