"""What is running: ask a head server for its instances and probe each one's health."""

from __future__ import annotations

import asyncio
from typing import Any

from nemo_gym.errors import ConfigError, NeMoGymError
from nemo_gym.transport import access, http_client
from nemo_gym.transport.http_client import TransportConfig, TransportError, response_json

__all__ = ["HeadServerUnreachable", "query_status"]


class HeadServerUnreachable(NeMoGymError):
    """No head server answered at the given address."""


async def _fetch(host: str, port: int, timeout_s: float) -> list[dict[str, Any]]:
    config = TransportConfig(connect_timeout_s=timeout_s, total_timeout_s=timeout_s, max_attempts=1)
    url_host = f"[{host}]" if ":" in host else host
    token = access.read_token_file(host, port)  # the run's token: this user's token file, or NEMO_GYM_RUN_TOKEN
    access.register(token, [f"http://{url_host}:{port}"])
    try:
        response = await http_client.request("GET", f"http://{url_host}:{port}/server_instances", config=config)
        if response.status == 401:  # it is there: not "no servers running", but a token to find
            raise ConfigError(
                f"the head server at {host}:{port} wants the run's token ({'a wrong one was sent' if token else 'none found'}): "
                f"run as the user who started it, or set {access.TOKEN_ENV_VAR}"
            )
        http_client.raise_for_status(response, "head server")
        instances = await response_json(response)
    except (TransportError, ValueError) as e:
        raise HeadServerUnreachable(str(e)) from e
    if not isinstance(instances, list):
        raise HeadServerUnreachable(f"unexpected answer from the head server: {instances!r:.200}")
    access.register(token, [str(i.get("url") or f"http://{i.get('host')}:{i.get('port')}") for i in instances])

    async def healthy(instance: dict[str, Any]) -> bool:
        url = str(instance.get("url") or f"http://{instance.get('host')}:{instance.get('port')}")
        url = url.replace("://0.0.0.0:", "://127.0.0.1:")
        try:
            probe = await http_client.request("GET", url.rstrip("/") + "/", config=config, retry=False)
        except TransportError:
            return False
        return probe.status == 200

    health = await asyncio.gather(*(healthy(i) for i in instances))
    return [{**instance, "healthy": ok} for instance, ok in zip(instances, health, strict=True)]


def query_status(host: str, port: int, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    """The head server's ``/server_instances`` entries, each with ``healthy`` (``GET /`` gave 200 within the timeout).

    Raises :class:`HeadServerUnreachable` when nothing answers at ``host:port``.
    """

    async def run() -> list[dict[str, Any]]:
        try:
            return await _fetch(host, port, timeout_s)
        finally:
            await http_client.close_session()

    return asyncio.run(run())
