"""Optional features (extras), and the command that installs one as it fits the
installation at hand.

``pip install cantrip-runtime`` installs the core: the runtime, the loom on SQLite,
the providers, the command line's cast/invoke/acp/loom/eval. Everything else is an
extra (issue 47.2): its packages are imported only by the code that uses them, and
that code first calls :func:`require_extra`, the one place a missing extra becomes one
line naming it -- at the point of use and, for what a spec file names, when the spec
loads. :data:`EXTRAS` says which importable modules each extra brings (a test checks it
against pyproject.toml).

A hint that says ``pip install 'cantrip-runtime[otel]'`` is wrong for someone working
in a clone (an editable install): it would pull the released package over their
checkout. pip records how a distribution was installed (PEP 610 ``direct_url.json``);
an editable one gets ``pip install -e '<its folder>[extra]'`` instead.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from importlib import metadata
from urllib.parse import unquote, urlparse

from cantrip._errors import ConstructionError
from cantrip._version import DISTRIBUTION

EXTRAS: Mapping[str, tuple[str, ...]] = {
    "js": ("quickjs",),
    "python": ("pydantic_monty",),
    "mcp": ("mcp", "mcp_types", "httpx2", "hypercorn"),
    "serve": ("hypercorn", "ag_ui"),
    "agui": ("hypercorn", "ag_ui"),
    "a2a": ("a2a", "google.protobuf", "starlette", "sse_starlette", "hypercorn", "ag_ui"),
    "postgres": ("psycopg", "psycopg_pool"),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
    "guardrails": ("re2",),
    "memory": ("sqlite_vec",),
}
"""The modules each extra installs, as :func:`require_extra` looks for them."""


class MissingExtraError(ConstructionError, ImportError):
    """A feature was used whose extra is not installed. A :class:`ConstructionError`
    (one line on the command line, a spec problem at load) and an ``ImportError``
    (what a program that probes for a feature catches)."""


def require_extra(extra: str, feature: str) -> None:
    """Return if ``extra`` is installed; otherwise raise :class:`MissingExtraError`
    with the one line that says so: ``FEATURE needs the 'EXTRA' extra: pip install ...``.

    Only looked for (``importlib.util.find_spec``), never imported: a spec that names
    the js medium is checked at load without starting QuickJS."""
    missing = [name for name in EXTRAS[extra] if not _importable(name)]
    if missing:
        raise MissingExtraError(f"{feature} needs the '{extra}' extra: {install_command(extra)}")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that is missing (google. of google.protobuf)
        return False


def install_command(extra: str) -> str:
    """``pip install ...`` for ``extra``: from the clone when cantrip was installed
    editable from one, from the package index otherwise."""
    folder = _editable_folder()
    if folder is not None:
        return f"pip install -e '{folder}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _editable_folder() -> str | None:
    """The clone cantrip was installed from in editable mode, if it was. Every
    distribution of the name is asked: run from inside a clone, the build's own
    ``*.egg-info`` folder comes first on the path and records nothing."""
    for dist in metadata.distributions(name=DISTRIBUTION):
        folder = _editable_source(dist.read_text("direct_url.json"))
        if folder is not None:
            return folder
    return None


def _editable_source(recorded: str | None) -> str | None:
    if not recorded:
        return None
    try:
        data = json.loads(recorded)
    except ValueError:
        return None
    if not isinstance(data, dict) or not (data.get("dir_info") or {}).get("editable"):
        return None
    url = urlparse(str(data.get("url", "")))
    return unquote(url.path) if url.scheme == "file" and url.path else None
