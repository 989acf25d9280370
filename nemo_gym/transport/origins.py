"""The origin of a URL, ``scheme://host:port``: what connections are pooled and queued by, and what a run's token is
registered for.

Its own module, on the standard library alone: the collect command reads origins while it registers the run's token,
before it needs asyncio or any HTTP client, and the model and resources servers never load yarl for it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from yarl import URL

__all__ = ["origin_of"]

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@lru_cache(maxsize=1024)
def origin_of(url: str | URL) -> str:
    """``scheme://host:port`` of a URL, the default port filled in; a ``yarl.URL`` (from aiohttp) is read from its
    own fields. A URL that cannot be read is its own origin."""
    try:
        if isinstance(url, str):
            parts = urlsplit(url)
            scheme, host, port = parts.scheme, parts.hostname, parts.port
        else:
            scheme, host, port = url.scheme, url.host, url.port
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        return f"{scheme}://{host}:{port}"
    except (TypeError, ValueError, AttributeError):
        return str(url)
