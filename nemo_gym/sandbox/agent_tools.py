"""What an agent that runs its harness inside a sandbox needs from the run's servers (NeMo Gym 0.7's
``sandbox.agent_tools``): the URLs the harness calls, an egress policy naming only those hosts, per-session MCP
entries for its tool servers, and verification of what it produced.

Unlike the rest of ``nemo_gym.sandbox`` this talks to servers, so it sits with the server kit
(``tests/unit/test_layers.py`` holds it apart from its folder's layer).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nemo_gym.base_resources_server import NEMO_GYM_MCP_METADATA_KEY, BaseRunRequest
from nemo_gym.config.server_models import ResourcesServerRef
from nemo_gym.failure_kinds import AGENT_RUN_ERROR
from nemo_gym.global_config import get_first_server_config_dict, get_global_config_dict
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.row_fields import FAILURE_KIND_KEY
from nemo_gym.server_utils import ServerClient, get_response_json

__all__ = ["restricted_network_policy", "sandbox_server_url", "seed_mcp_servers", "verify_agent_response"]

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}
_POLICY_PROVIDER = "opensandbox"


def _url(host: str, port: object) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _reachable_or_raise(host: str | None, where: str) -> str:
    """``host`` when a sandbox elsewhere could reach it; a ``ValueError`` for empty, localhost, loopback, wildcard."""
    name = (host or "").strip("[]").rstrip(".")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    local = name.lower() == "localhost" or (address is not None and (address.is_loopback or address.is_unspecified))
    if not name or local:
        raise ValueError(
            f"{where}: host {host!r} is not reachable from a sandbox; the server must advertise a sandbox-reachable "
            "address (set use_absolute_ip: true, or bind it to an explicit host), not loopback or a wildcard"
        )
    return name


def get_server_url(server_name: str) -> str:
    """``http://host:port`` of a server instance of the run's config (an IPv6 host in brackets).

    A module attribute, called by :func:`sandbox_server_url` on every use, so that it can be replaced here (NeMo Gym
    0.7's folders patch ``nemo_gym.sandbox.agent_tools.get_server_url``)."""
    settings = get_first_server_config_dict(get_global_config_dict(), server_name)
    return _url(str(settings["host"]), settings["port"])


def sandbox_server_url(name: str, *, require_reachable: bool = False) -> str:
    """``http://host:port`` of the run's server ``name``, as a sandboxed harness should call it.

    A server bound to a wildcard address is reached over loopback, which works for a sandbox on the host's network.
    ``require_reachable`` is for a sandbox elsewhere or one whose egress is limited to named hosts: it refuses a
    loopback or wildcard host instead of rewriting it, since no rewrite would make it reachable. The address comes
    from this module's ``get_server_url`` (looked up per call, so a test or a deployment can replace it here).
    """
    base = get_server_url(name).rstrip("/")
    parts = urlsplit(base)
    host = parts.hostname or ""
    if require_reachable:
        _reachable_or_raise(host, f"server {name!r}")
        return base
    if host not in _WILDCARDS:
        return base
    netloc = _url(_WILDCARDS[host], parts.port).removeprefix("http://") if parts.port else _WILDCARDS[host]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def restricted_network_policy(provider_name: str, urls: list[str]) -> dict[str, object]:
    """An egress policy that denies everything but the hosts of ``urls``, for the provider that enforces one.

    Fails closed: a provider that cannot enforce egress rules, or a URL whose host a remote sandbox cannot reach,
    is an error, never a sandbox that silently keeps full network access.
    """
    if provider_name != _POLICY_PROVIDER:
        raise ValueError(
            f"restricted network access needs a provider that enforces egress rules (OpenSandbox); "
            f"{provider_name!r} cannot, so use network_access: inherit or switch providers"
        )
    hosts = sorted({_reachable_or_raise(urlsplit(url).hostname, url) for url in urls})
    return {"defaultAction": "deny", "egress": [{"action": "allow", "target": host} for host in hosts]}


async def _ok_json(response: Any, server: str, path: str) -> Any:
    from nemo_gym.transport.passthrough import check_status

    await check_status(response, server, path)
    return await get_response_json(response)


async def seed_mcp_servers(
    client: ServerClient,
    servers: list[ResourcesServerRef],
    body: BaseRunRequest,
    cookies: Mapping[str, str],
    *,
    timeout_s: float,
    require_reachable: bool = False,
) -> dict[str, dict[str, object]]:
    """Seed each tool server for this rollout and return the MCP entries the harness's config needs, by server.

    The harness gets only the per-session headers the seed answered (its MCP session), never the agent's cookies.
    A server whose seed answers no authenticated MCP endpoint is refused: the harness could not use its tools.
    """
    # Harness MCP configs take their timeout in milliseconds.
    common: dict[str, object] = {"enabled": True, "timeout": int(timeout_s * 1000)}

    async def entry_of(server: ResourcesServerRef) -> dict[str, object]:
        answer = await client.post(
            server_name=server.name, url_path="/seed_session", json=body.model_dump(), cookies=cookies
        )
        mcp = (await _ok_json(answer, server.name, "/seed_session")).get(NEMO_GYM_MCP_METADATA_KEY)
        if not isinstance(mcp, dict) or not mcp.get("headers"):
            raise ValueError(
                f"tool server {server.name!r} answered /seed_session without authenticated MCP tools; "
                "set expose_tools_over_mcp: true on it"
            )
        base = sandbox_server_url(server.name, require_reachable=require_reachable)
        route = str(mcp.get("url_path") or "/mcp").lstrip("/")
        return {"url": f"{base}/{route}", "headers": mcp["headers"], **common}

    # One server after another, in the order given (a failed seed stops the rest).
    return {server.name: await entry_of(server) for server in servers}


async def verify_agent_response(
    client: ServerClient,
    server: ResourcesServerRef,
    body: BaseRunRequest,
    response: NeMoGymResponse,
    cookies: Mapping[str, str],
    *,
    force_zero_reward: bool,
) -> dict[str, Any]:
    """``/verify`` the harness's response and return the verifier's answer, whose score fields are its own.

    With ``force_zero_reward`` (the harness failed) the verifier grades an empty response instead, so the zero
    comes from the verifier's own rules; it must answer an unmasked 0 or this raises. The answer then carries the
    real response back, for inspection, with an ``agent_run_error`` failure kind.
    """
    graded = response if not force_zero_reward else response.model_copy(update={"output": []})
    payload = body.model_dump(mode="json") | {"response": graded.model_dump(mode="json")}
    answer = await client.post(server_name=server.name, url_path="/verify", json=payload, cookies=cookies)
    result: dict[str, Any] = await _ok_json(answer, server.name, "/verify")
    if not force_zero_reward:
        return result
    if result.get("reward") != 0 or result.get("mask_sample", False):
        raise ValueError(
            f"execution_failure_reward_zero needs a verifier that scores an empty response as an unmasked 0; "
            f"{server.name!r} answered reward={result.get('reward')!r}, mask_sample={result.get('mask_sample')!r}"
        )
    result["response"] = response.model_dump(mode="json")
    result[FAILURE_KIND_KEY] = AGENT_RUN_ERROR
    result["failure_reason"] = "the agent's harness failed; its empty response was verified for the zero reward"
    return result
