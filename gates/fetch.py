"""``fetch``: HTTP GET of a URL whose host the circle allows.

The allow-list is a dependency fixed at construction (CIRCLE-10); the default
allows nothing, so a circle reaches the network only when its author says so
(spec 4.8: ward off one leg of the lethal trifecta by default).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from cantrip import GateError, gate

MAX_CHARS = 100_000


@gate(dependencies=("allow_hosts", "timeout_s"))
async def fetch(url: str, allow_hosts: tuple[str, ...] = (), timeout_s: float = 10.0) -> str:
    """Fetch ``url`` with HTTP GET and return the response body as text."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GateError(f"fetch takes an http(s) URL, not {url!r}")
    if parts.hostname not in allow_hosts and "*" not in allow_hosts:
        raise GateError(
            f"host {parts.hostname!r} is not allowed by this circle "
            f"(allowed: {', '.join(allow_hosts) or 'none'})"
        )
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as client:
        response = await client.get(url)
    if response.status_code >= 400:
        raise GateError(f"HTTP {response.status_code} from {url}")
    return response.text[:MAX_CHARS]
