"""The command that installs an extra, as it fits the installation at hand.

A hint that says ``pip install 'cantrip-runtime[otel]'`` is wrong for someone working
in a clone (an editable install): it would pull the released package over their
checkout. pip records how a distribution was installed (PEP 610 ``direct_url.json``);
an editable one gets ``pip install -e '<its folder>[extra]'`` instead.
"""

from __future__ import annotations

import json
from importlib import metadata
from urllib.parse import unquote, urlparse

from cantrip._version import DISTRIBUTION


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
