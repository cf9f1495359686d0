"""Local OpenAI-compatible servers: Ollama, LM Studio, vLLM, llama.cpp, and the like.

The wire format is OpenAI's; what differs between servers is described by
compatibility flags in each endpoint's TOML (``ollama.toml``, ``lmstudio.toml``,
``vllm.toml``, ``llamacpp.toml``, or ``local.toml`` for anything else):
the output-limit field name, whether usage can be asked for in a stream,
tool-id constraints (``tool_ids = "mistral"`` projects ids to 9 alphanumerics
through the transcript renderer), ``system`` vs ``developer`` role, where
reasoning arrives (a field or ``<think>`` tags), whether ``tool_choice`` is
understood (if not, ``required`` is simulated by one re-prompt, LLM-5), and
whether tool calls that arrive without ids get deterministic ones.

A key is optional: it is sent as a Bearer token only when its variable is set.
Requests to loopback addresses never go through a proxy from the environment.
"""

from __future__ import annotations

from cantrip.llm.providers.openai import OpenAIAdapter


class LocalAdapter(OpenAIAdapter):
    pass


ADAPTER = LocalAdapter
