"""Spec files: declarative cantrips, read from TOML and built into a :class:`~cantrip.Cantrip`.

The spec layer stands above the cantrip it builds: nothing under the cantrip (the
entity, the circle, the gate providers) imports it; the command line, the protocol
front ends' servers, the conformance runner, evals and the workers do. Its rooms:

* :mod:`._tables` -- the tables of a spec file as pydantic models (what each key may be);
* :mod:`._providers` -- the ``[[circle.mcp]]`` and ``[[circle.a2a]]`` tables, and which
  of their fields may carry credentials;
* :mod:`._load` -- TOML or a mapping to a document, every problem with its position;
* :mod:`._llm` -- an ``[llm]`` table to an LLM (scripted, or a provider stack);
* :mod:`._circle` -- the ``[circle]`` table's medium and gates;
* :mod:`._build` -- a document to a cantrip, every problem reported at once.
"""

from cantrip._provider_fields import CREDENTIAL_FIELDS
from cantrip.spec._build import build_cantrip
from cantrip.spec._llm import build_llm
from cantrip.spec._load import load_spec_file, parse_spec
from cantrip.spec._providers import (
    A2ATable,
    MCPTable,
    agents_from_tables,
    servers_from_tables,
)
from cantrip.spec._tables import CircleSpec, LLMSpec, SpecDocument

__all__ = [
    "CREDENTIAL_FIELDS",
    "A2ATable",
    "CircleSpec",
    "LLMSpec",
    "MCPTable",
    "SpecDocument",
    "agents_from_tables",
    "build_cantrip",
    "build_llm",
    "load_spec_file",
    "parse_spec",
    "servers_from_tables",
]
