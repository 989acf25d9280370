"""Which server a row goes to: its agent, or an environment server in front of it (NeMo Gym 0.7's routing).

With ``environment_routing_mode: agent`` (the default) an agent that one environment server fronts gets its rows
through that server's ``/run``, as they are; an agent that none fronts gets them directly, which is what NeMo Gym's
generated ``legacy_agent`` relay does, without its extra hop (set ``error_on_agent_without_environment_server`` to
refuse such an agent instead). ``legacy`` sends every row through ``environment_server_name``. A materialized task
row (``task_id`` object + ``task_input``) goes to the environment server its task set names in
``environment_server_routes``, as a typed episode request (:func:`episode_request`), in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_gym.config.server_models import environment_servers_by_agent
from nemo_gym.errors import ConfigError
from nemo_gym.row_fields import (
    ATTEMPT_INDEX_KEY,
    FAILURE_CLASS_KEY,
    FAILURE_KIND_KEY,
    FAILURE_MESSAGE_KEY,
    FAILURE_STAGE_KEY,
    FAILURE_TERMINAL_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
)

__all__ = ["ENVIRONMENT_SERVER_FAILED", "TASK_ID_KEY", "Routes", "episode_record", "episode_request", "routes_for"]

ENVIRONMENT_SERVER_FAILED = "environment_server_failed"
"""The failure class of an episode an environment server answered with a failure (its kind says what failed)."""
TASK_ID_KEY = "_ng_task_id"
"""The materialized task's id (task set + task id) on the row stored for it."""

ERROR_ON_UNFRONTED_KEY = "error_on_agent_without_environment_server"


@dataclass(frozen=True)
class Routes:
    """Where rows go: ``fronted`` agent -> environment server for flat rows, ``tasksets`` task set -> environment
    server for materialized tasks, and every environment server's base URL."""

    fronted: dict[str, str]
    tasksets: dict[str, str]
    urls: dict[str, str]

    def for_agent(self, agent: str) -> tuple[str, str] | None:
        """``(environment server, url)`` a flat row of ``agent`` goes through, or None: straight to the agent."""
        name = self.fronted.get(agent)
        return None if name is None else (name, self.urls[name])


def routes_for(
    config: Mapping[str, Any], urls: dict[str, str], mode: str, legacy_server: str | None, tasksets: dict[str, str]
) -> Routes:
    """The routes of a run. ``config``: the composed config; ``urls``: each environment server's base URL; the rest:
    the run's routing settings (``rollouts/config.py``). A setting naming a server the config lacks, or an agent
    fronted by several environment servers in ``agent`` mode, is a :class:`ConfigError` before any rollout."""
    for setting, name in [("environment_server_name", legacy_server), *(
        (f"environment_server_routes.{taskset}", server) for taskset, server in tasksets.items()
    )]:  # fmt: skip
        if name is not None and name not in urls:
            known = ", ".join(sorted(urls)) or "none"
            raise ConfigError(f"{setting}: no environment server named {name!r} runs (environment servers: {known})")
    by_agent = environment_servers_by_agent(config)
    agents = [str(k) for k, v in config.items() if isinstance(v, Mapping) and "responses_api_agents" in v]
    if mode == "legacy":
        assert legacy_server is not None  # the settings' own validation
        return Routes({agent: legacy_server for agent in agents}, dict(tasksets), dict(urls))
    fronted: dict[str, str] = {}
    for agent in agents:
        servers = [s for s in by_agent.get(agent, []) if s in urls]
        if len(servers) > 1:
            environment_server_for_agent(agent, {agent: servers})  # raises: the rows cannot choose
        if servers:
            fronted[agent] = servers[0]
        elif config.get(ERROR_ON_UNFRONTED_KEY):
            raise ConfigError(
                f"agent {agent!r} has no environment server in front of it, and {ERROR_ON_UNFRONTED_KEY} is set: "
                "add one (environment_servers/legacy_agent relays /run unchanged) or unset the key"
            )
    return Routes(fronted, dict(tasksets), dict(urls))


def episode_request(row: Mapping[str, Any]) -> dict[str, Any]:
    """The typed episode request of a materialized task row: its task, and which attempt of which rollout."""
    from nemo_gym.observability.correlation import rollout_id_from_run_body

    attempt = row.get(ATTEMPT_INDEX_KEY, 0)
    rollout_id = rollout_id_from_run_body({**row, ATTEMPT_INDEX_KEY: 0})
    if rollout_id is None:
        rollout_id = f"{row.get(TASK_INDEX_KEY)}-{row.get(ROLLOUT_INDEX_KEY)}"
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": attempt},
        "task": {"task_id": row["task_id"], "task_input": row["task_input"]},
    }


def episode_record(response: Mapping[str, Any]) -> dict[str, Any]:
    """The row the collector stores for an environment server's typed answer (``BaseEpisodeResponse``).

    A ``result`` is stored as the server gave it (its top-level ``reward`` is the score), with ``_ng_task_id``; a
    ``failure`` becomes a failure row: class ``environment_server_failed``, its kind, stage, reason and
    terminality. A result that uses the collector's own ``_ng_*`` keys is refused: they would be overwritten.
    """
    task_id = response.get("task_id")
    failure = response.get("failure")
    if failure is not None:
        if not isinstance(failure, Mapping):
            raise ValueError(f"the environment server's failure for task {task_id!r} is not an object: {failure!r}")
        record: dict[str, Any] = {
            TASK_ID_KEY: task_id,
            FAILURE_CLASS_KEY: ENVIRONMENT_SERVER_FAILED,
            FAILURE_MESSAGE_KEY: failure.get("failure_reason"),
        }
        if failure.get("terminal"):
            record[FAILURE_TERMINAL_KEY] = True
        for source, key in (("failure_kind", FAILURE_KIND_KEY), ("stage", FAILURE_STAGE_KEY),
                            ("partial_response", "_ng_failure_partial_response")):  # fmt: skip
            if failure.get(source) is not None:
                record[key] = failure[source]
        return record
    result = response.get("result")
    if not isinstance(result, Mapping):
        raise ValueError(f"the environment server's result for task {task_id!r} is not an object: {result!r}")
    reserved = sorted(key for key in result if key.startswith("_ng_"))
    if reserved:
        raise ValueError(f"the environment server's result for task {task_id!r} uses the collector's keys {reserved}")
    return {**result, TASK_ID_KEY: task_id}


def environment_server_for_agent(agent: str, servers_by_agent: Mapping[str, list[str]]) -> str:
    """The one environment server in front of ``agent`` (``servers_by_agent``: from ``environment_servers_by_agent``).

    A row that names only its agent cannot pick between several servers, and cannot reach an agent none fronts: both
    are :class:`ConfigError`, as in NeMo Gym 0.7, where validation is meant to catch them before any server starts.
    """
    servers = sorted(servers_by_agent.get(agent, []))
    if len(servers) != 1:
        raise ConfigError(
            f"agent {agent!r} is fronted by several environment servers ({', '.join(servers)}): a row routed by its "
            "agent cannot choose; set environment_routing_mode=legacy with environment_server_name, or route by task set"
            if servers
            else f"agent {agent!r} has no environment server in front of it, so no row can reach it"
        )
    return servers[0]
