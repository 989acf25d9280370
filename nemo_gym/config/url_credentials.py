"""A server's base URL with ``user:password@`` credentials beside an API key: refused before anything starts.

A client that sends the API key as an ``Authorization`` header cannot also send the URL's credentials (aiohttp refuses
to combine them), so such a server answered every call with HTTP 500 once the run had started. Either alone works:
the key as a bearer token, or the URL's credentials as Basic auth. The error names the key the user wrote (the
top-level ``policy_base_url`` that a server block interpolates, where it is one) with its file and line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from nemo_gym.config.server_models import ServerInstanceConfig
from nemo_gym.config.validation import SourceLocator
from nemo_gym.errors import ConfigError

URL_KEY_SUFFIXES = ("base_url", "api_base")
"""Keys of a server block that hold the endpoint it calls (``openai_base_url``, ``base_url``, litellm's ``api_base``)."""
API_KEY_SUFFIX = "api_key"


class UrlCredentialsError(ConfigError):
    """A base URL carries ``user:password@`` while the same server is given an API key."""


def check_url_credentials(
    config: dict[str, Any], instances: Iterable[ServerInstanceConfig], locator: SourceLocator
) -> None:
    """Refuse the first server whose base URL has credentials and whose block also sets an API key."""
    for instance in instances:
        inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
        api_keys = [k for k, v in inner.items() if str(k).endswith(API_KEY_SUFFIX) and isinstance(v, str) and v]
        if not api_keys:
            continue
        for key, value in inner.items():
            if str(key).endswith(URL_KEY_SUFFIXES) and any(_has_credentials(url) for url in _urls(value)):
                block = [instance.name, instance.SERVER_TYPE, instance.implementation]
                url_path = _written_as(config, value) or [*block, str(key)]
                api_key = _written_as(config, inner[api_keys[0]]) or [*block, api_keys[0]]
                raise UrlCredentialsError(
                    locator.describe(
                        url_path,
                        f"the URL carries user:password@ credentials and {'.'.join(api_key)} is set too, so every "
                        f"call of server {instance.name!r} would fail (HTTP 500): remove the user:password@ part "
                        "from the URL (the API key authenticates on its own), or leave the API key empty",
                    )
                )


def _urls(value: Any) -> list[str]:
    """A URL key's value as a list of URLs (``vllm_model`` takes a list of replicas)."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _has_credentials(url: str) -> bool:
    try:
        return "@" in urlsplit(url.strip()).netloc
    except ValueError:
        return False


def _written_as(config: dict[str, Any], value: Any) -> list[str] | None:
    """The top-level key holding ``value`` (``policy_base_url``, which server blocks interpolate), if one does."""
    for key, top in config.items():
        if top == value and isinstance(top, (str, list)):
            return [str(key)]
    return None
