"""Asking a running head server for its config, and sending the run's token only to the servers it names.

Kept apart from ``server_utils`` (which re-exports :func:`fetch_config_from_head_server`) so that a client of running
servers, such as ``gym eval run --no-serve``, needs only urllib and omegaconf here, not the web server stack.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from omegaconf import DictConfig, OmegaConf

from nemo_gym.config.compose import DEFAULT_HOST
from nemo_gym.config.server_models import SERVER_TYPES, BaseServerConfig
from nemo_gym.errors import ConfigError
from nemo_gym.transport import access

HEAD_SERVER_URL_ENV_VAR = "NEMO_GYM_HEAD_SERVER_URL"


def fetch_config_from_head_server(head: BaseServerConfig, timeout_s: float = 10.0) -> DictConfig:
    """The head server's (masked) config. Its token comes from ``NEMO_GYM_RUN_TOKEN`` or the run's token file, and
    is then sent to every server that config names."""
    head_url = f"http://{head.host}:{head.port}"
    token = access.registered_token(head_url) or access.read_token_file(head.host, head.port)
    access.register(token, [head_url])
    try:
        with urllib.request.urlopen(with_token(f"{head_url}/global_config_dict_yaml"), timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as e:
        if e.code != 401:
            raise ConfigError(f"the head server at {head.host}:{head.port} answered HTTP {e.code}") from e
        where = access.token_file(head.host, head.port)
        raise ConfigError(
            f"the head server at {head.host}:{head.port} wants the run's token ({'a wrong one was sent' if token else 'none found'}). "
            f"Run as the user who started it (the token is in {where}), or set {access.TOKEN_ENV_VAR}"
        ) from e
    except (urllib.error.URLError, OSError) as e:
        raise ConfigError(
            f"cannot reach the head server at {head.host}:{head.port} ({e}). Start the servers with `gym env start`, "
            f"or set {HEAD_SERVER_URL_ENV_VAR}"
        ) from e
    config = OmegaConf.create(body if isinstance(body, str) else json.dumps(body))
    if not isinstance(config, DictConfig):
        raise ConfigError(f"the head server at {head.host}:{head.port} sent a config that is not a mapping")
    register_run_token(config, token)
    return config


def register_run_token(config: DictConfig, token: str | None = None) -> None:
    """Send the run's token (``token``, else the config's own ``run_token``) to every server instance of ``config``
    and its head server, and to nothing else."""
    token = token or config.get(access.RUN_TOKEN_KEY)
    if not token:
        return
    urls = []
    for block in config.values():
        server_type = next((t for t in SERVER_TYPES if isinstance(block, DictConfig) and t in block), None)
        if server_type is None or not isinstance(block[server_type], DictConfig) or not block[server_type]:
            continue
        inner = next(iter(block[server_type].values()))
        if isinstance(inner, DictConfig) and inner.get("host") and inner.get("port"):
            urls.append(f"http://{inner['host']}:{inner['port']}")
    head = config.get("head_server")
    if isinstance(head, DictConfig) and head.get("port"):
        urls.append(f"http://{head.get('host') or DEFAULT_HOST}:{head['port']}")
    access.register(str(token), urls)


def with_token(url: str) -> urllib.request.Request | str:
    """``url`` as a request carrying the run's token when the token is registered for it."""
    token = access.registered_token(url)
    return urllib.request.Request(url, headers={access.TOKEN_HEADER: token}) if token else url
