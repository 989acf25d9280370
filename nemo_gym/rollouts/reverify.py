"""``gym eval reverify``: score stored rollouts again with the current verifier, without any inference.

When a verifier is fixed (a parsing bug, a stricter answer check), the rollouts already collected can be re-scored
instead of re-generated: each stored ``response`` is sent with its input row to the resources server's ``/verify``.

That is only sound when ``/verify`` reads nothing but the row and the transcript. A server whose verification looks
at session state built by the rollout's tool calls (a sandbox's files, a database) would score an empty session, so
each resources server is asked ``GET /reverify_mode`` first and anything but ``stateless`` is refused unless forced.

Only the resources servers that verify the stored rollouts (and servers they refer to, such as a judge model) are
started: no agent, and no policy model unless a verifier needs it. Outputs, next to ``--output``: the new rollouts
(each stored row with the new reward and verify fields, plus ``_ng_previous_reward``), ``<stem>_failures.jsonl`` for
rollouts that could not be verified, and ``<stem>_aggregate_metrics.json``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import orjson
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from nemo_gym.base_resources_server import ReverifyMode
from nemo_gym.config.compose import ComposedConfig
from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.config.server_models import is_server_ref
from nemo_gym.config.tree import plain_dict
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import JsonlWriter, iter_jsonl, iter_jsonl_spans
from nemo_gym.rollouts.aggregate import (
    agent_name_of,
    aggregate_metrics_path,
    compute_metrics,
    encoded_rows_by_agent,
    write_metrics,
)
from nemo_gym.rollouts.collector import FAILURE_CLASS_KEY, FAILURE_MESSAGE_KEY, failures_path
from nemo_gym.rollouts.config import DEFAULT_REVERIFY_CONCURRENCY
from nemo_gym.rollouts.materialize import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.rollouts.pool import run_bounded
from nemo_gym.rollouts.shards import Key, RowIndex, row_key_at
from nemo_gym.row_fields import REWARD_TOLERANCE
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import ServerTimeoutError, TransportConfig, TransportError

PREVIOUS_REWARD_KEY = "_ng_previous_reward"
UNSAFE_KEY = "_ng_reverify_unsafe"
"""Set on rows re-scored with ``--force`` by a server that does not declare its verification stateless."""
STATELESS = ReverifyMode.STATELESS
KEPT_FROM_STORED = ("response", "responses_create_params")
"""Fields of the stored row that a verify answer never replaces (the answer only echoes them back)."""
MAX_LISTED = 5
_MODE_CONFIG = TransportConfig(connect_timeout_s=5.0, total_timeout_s=30.0, max_attempts=3)


@dataclass
class ReverifyOptions:
    inputs_path: Path
    rollouts_path: Path
    output_path: Path
    concurrency: int = DEFAULT_REVERIFY_CONCURRENCY
    force: bool = False
    limit: int | None = None
    disable_aggregation: bool = False
    verify_timeout_s: float = 600.0
    show_progress: bool = True
    """A progress bar on stderr, only when stderr is a terminal (in a log its redraws are noise)."""


@dataclass
class ReverifyPlan:
    """The checked inputs of a re-verification: every stored rollout has its input row and a response."""

    options: ReverifyOptions
    inputs: RowIndex
    rollouts_per_agent: dict[str, int]

    @property
    def num_rollouts(self) -> int:
        return sum(self.rollouts_per_agent.values())


@dataclass
class ReverifySummary:
    output_path: Path
    failures_path: Path
    verified: int = 0
    failed: int = 0
    changed: int = 0
    increased: int = 0
    decreased: int = 0
    previous_reward_sum: float = 0.0
    reward_sum: float = 0.0
    failure_classes: Counter = field(default_factory=Counter)
    modes: dict[str, str] = field(default_factory=dict)
    """resources server -> its ``/reverify_mode`` answer."""
    elapsed_s: float = 0.0
    metrics: list[dict[str, Any]] | None = None
    metrics_path: Path | None = None

    @property
    def unsafe_servers(self) -> list[str]:
        return sorted(name for name, mode in self.modes.items() if mode != STATELESS)


# ---------------------------------------------------------------------------------------------------------------------
# Checking the files (before any server starts)


def plan_reverify(options: ReverifyOptions) -> ReverifyPlan:
    """Index the inputs and check every stored rollout against them; all problems are found before servers start."""
    if options.limit is not None and options.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {options.limit}")
    if options.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {options.concurrency}")
    output = options.output_path.resolve()
    for flag, path in (("--rollouts", options.rollouts_path), ("--inputs", options.inputs_path)):
        if path.resolve() == output:
            raise ConfigError(
                f"--output must be a new file, not the {flag} file {path}: reverify never edits its inputs"
            )
    inputs = RowIndex([options.inputs_path])
    for line, offset, length, row in iter_jsonl_spans(options.inputs_path):
        inputs.add(0, line, offset, length, row)
    seen: dict[Key, int] = {}
    problems: list[str] = []
    per_agent: Counter = Counter()
    for line, row in iter_jsonl(options.rollouts_path, options.limit):
        where = f"{options.rollouts_path}:{line}"
        key = row_key_at(row, where)
        if key in seen:
            raise ConfigError(f"{where}: (task {key[0]}, rollout {key[1]}) already appears at line {seen[key]}")
        seen[key] = line
        if key not in inputs:
            problems.append(f"{where}: (task {key[0]}, rollout {key[1]}) is not in {options.inputs_path}")
        elif not isinstance(row.get("response"), dict):
            problems.append(f"{where}: the rollout has no stored response to verify")
        per_agent[agent_name_of(row)] += 1
    if problems:
        listed = "; ".join(problems[:MAX_LISTED]) + (
            f"; … {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        )
        raise ConfigError(f"{len(problems)} stored rollout(s) cannot be re-verified: {listed}")
    if not per_agent:
        raise ConfigError(f"{options.rollouts_path} holds no rollouts to re-verify")
    return ReverifyPlan(options, inputs, dict(per_agent))


# ---------------------------------------------------------------------------------------------------------------------
# Which servers verify


def verifier_of_agents(config: ComposedConfig | DictConfig, agents: list[str]) -> dict[str, str]:
    """agent name -> the resources server its config names (``resources_server: {type, name}``)."""
    by_name = {instance.name: instance for instance in ComposedConfig.of(config).instances_of("responses_api_agents")}
    routes: dict[str, str] = {}
    problems = []
    for agent in sorted(agents):
        instance = by_name.get(agent)
        if instance is None:
            known = ", ".join(sorted(by_name)) or "none"
            problems.append(f"agent {agent!r} is not in the config (agents: {known})")
            continue
        ref = is_server_ref(instance.get_inner_run_server_config_dict().get("resources_server"))
        if ref is None or ref.type != "resources_servers":
            problems.append(f"agent {agent!r} names no resources_server in its config, so nothing can verify its rows")
            continue
        routes[agent] = ref.name
    if problems:
        raise ConfigError("cannot re-verify: " + "; ".join(problems) + ". Pass the config the rollouts were made with")
    return routes


def _refs_in(node: Any) -> Iterator[str]:
    ref = is_server_ref(node) if isinstance(node, dict) else None
    if ref is not None:
        yield ref.name
    elif isinstance(node, dict):
        for value in node.values():
            yield from _refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs_in(value)


def config_for_reverify(config: ComposedConfig | DictConfig, resources_servers: set[str]) -> ComposedConfig:
    """The config without the servers reverification does not need: only the given resources servers and whatever
    they refer to (a judge model, say) stay, so no agent and no unneeded policy model is started."""
    composed = ComposedConfig.of(config)
    data = plain_dict(composed.config)
    names = {instance.name for instance in composed.instances}
    keep: set[str] = set()
    pending = list(resources_servers)
    while pending:
        name = pending.pop()
        if name in keep or name not in names:
            continue
        keep.add(name)
        pending.extend(_refs_in(data[name]))
    kept = OmegaConf.create({key: value for key, value in data.items() if key not in names or key in keep})
    kept_instances = [i for i in composed.instances if i.name in keep]
    return ComposedConfig(kept, kept_instances, composed.env_yaml_path, secrets=composed.secrets)


def server_urls(config: ComposedConfig | DictConfig) -> dict[str, str]:
    """Base URL of every server instance of a config whose ports are assigned."""
    urls = {}
    for instance in ComposedConfig.of(config).instances:
        inner = instance.get_inner_run_server_config()
        if inner.host and inner.port:
            host = f"[{inner.host}]" if ":" in inner.host else inner.host
            urls[instance.name] = f"http://{host}:{inner.port}"
    return urls


async def check_reverify_modes(urls: dict[str, str], force: bool) -> dict[str, str]:
    """Ask each resources server once whether its ``/verify`` may be re-run; refuse unless all say stateless."""
    modes: dict[str, str] = {}
    for name, url in sorted(urls.items()):
        try:
            answer = await http_client.request(
                "GET", f"{url}/reverify_mode", server_name=name, url_path="/reverify_mode", config=_MODE_CONFIG
            )
        except TransportError as e:
            raise ConfigError(f"cannot ask resources server {name!r} for its /reverify_mode: {e}") from e
        if answer.status == 404:  # a server older than the endpoint: nothing is known about it
            modes[name] = ReverifyMode.UNKNOWN
            continue
        http_client.raise_for_status(answer, name, "/reverify_mode")
        mode = await http_client.response_json(answer)
        modes[name] = mode if isinstance(mode, str) else ReverifyMode.UNKNOWN
    unsafe = {name: mode for name, mode in modes.items() if mode != STATELESS}
    if unsafe and not force:
        described = ", ".join(f"{name!r} says {mode!r}" for name, mode in sorted(unsafe.items()))
        raise ConfigError(
            f"re-verification refused: {described} (GET /reverify_mode must answer 'stateless'). Such a verifier may "
            "read state that the rollout's tool calls built up, which a stored rollout cannot rebuild, so new rewards "
            f"could be wrong. Pass --force to verify anyway; those rows get {UNSAFE_KEY}: true"
        )
    return modes


# ---------------------------------------------------------------------------------------------------------------------
# Re-verifying


class Reverifier:
    """Sends every stored rollout (with its input row) to its verifier; at most ``concurrency`` at a time."""

    def __init__(self, plan: ReverifyPlan, routes: dict[str, str], urls: dict[str, str]) -> None:
        self.plan = plan
        self.options = plan.options
        self.routes = routes
        self.urls = urls
        self.summary = ReverifySummary(self.options.output_path, failures_path(self.options.output_path))
        self._transport = TransportConfig(total_timeout_s=self.options.verify_timeout_s)
        self._inputs_fd = -1

    async def run(self) -> ReverifySummary:
        started = time.monotonic()
        needed = {self.routes[agent] for agent in self.plan.rollouts_per_agent}
        missing = sorted(name for name in needed if name not in self.urls)
        if missing:
            raise ConfigError(f"resources server(s) {', '.join(missing)} are not running")
        self.summary.modes = await check_reverify_modes({name: self.urls[name] for name in needed}, self.options.force)
        output, failures = self.summary.output_path, self.summary.failures_path
        for path in (output, failures):
            path.unlink(missing_ok=True)
        self._output, self._failures = JsonlWriter(output), JsonlWriter(failures)
        self._bar = tqdm(
            total=self.plan.num_rollouts, desc="Re-verifying", unit="rollout",
            disable=None if self.options.show_progress else True, dynamic_ncols=True, mininterval=0.5,
        )  # fmt: skip
        self._inputs_fd = os.open(self.options.inputs_path, os.O_RDONLY)
        try:
            pending = (row for _, row in iter_jsonl(self.options.rollouts_path, self.options.limit))
            await run_bounded(self._verify_and_count, pending, self.options.concurrency)
        finally:
            os.close(self._inputs_fd)
            self._output.close()
            self._failures.close()
            self._bar.close()
            self.summary.elapsed_s = time.monotonic() - started
        if failures.exists() and failures.stat().st_size == 0:
            failures.unlink()
        _sort_in_place(output)
        return self.summary

    def _input_row(self, key: Key) -> dict[str, Any]:
        _, _, offset, length = self.plan.inputs.spans[key]
        return orjson.loads(os.pread(self._inputs_fd, length, offset))

    async def _verify_and_count(self, stored: dict[str, Any]) -> None:
        await self._verify_one(stored)
        self._bar.update(1)

    async def _verify_one(self, stored: dict[str, Any]) -> None:
        key = (int(stored[TASK_INDEX_KEY]), int(stored[ROLLOUT_INDEX_KEY]))
        server = self.routes[agent_name_of(stored)]
        body = self._input_row(key) | {"response": stored["response"]}
        try:
            answer = await http_client.request(
                "POST", f"{self.urls[server]}/verify", json=body, server_name=server, url_path="/verify",
                config=self._transport,
            )  # fmt: skip
        except ServerTimeoutError as e:
            self._fail(stored, "verify_timeout", str(e))
            return
        except TransportError as e:
            self._fail(stored, "connection_error", str(e))
            return
        raw = await answer.read()
        if answer.status != 200:
            failure = "invalid_row" if answer.status == 422 else "verify_failed"
            self._fail(stored, failure, f"HTTP {answer.status}: {raw[:2000].decode('utf-8', 'replace')}")
            return
        try:
            result = orjson.loads(raw)
        except orjson.JSONDecodeError:
            result = None
        if not isinstance(result, dict) or not _is_number(result.get("reward")):
            self._fail(stored, "invalid_response", "the /verify answer has no numeric reward")
            return
        if result.get(FAILURE_CLASS_KEY):  # e.g. a judge that could not be reached: not a reward of 0
            self._fail(stored, str(result[FAILURE_CLASS_KEY]), str(result.get(FAILURE_MESSAGE_KEY, "")))
            return
        self._record(stored, result, unsafe=self.summary.modes.get(server) != STATELESS)

    def _record(self, stored: dict[str, Any], result: dict[str, Any], unsafe: bool) -> None:
        row = dict(stored)
        for name, value in result.items():
            if name not in KEPT_FROM_STORED and not name.startswith("_ng_"):
                row[name] = value
        previous = stored.get("reward")
        row[PREVIOUS_REWARD_KEY] = previous
        if unsafe:
            row[UNSAFE_KEY] = True
        self._output.write(row)
        summary = self.summary
        summary.verified += 1
        new = float(row["reward"])
        summary.reward_sum += new
        if _is_number(previous):
            summary.previous_reward_sum += float(previous)
            summary.changed += int(abs(new - float(previous)) > REWARD_TOLERANCE)
            summary.increased += int(new > float(previous) + REWARD_TOLERANCE)
            summary.decreased += int(new < float(previous) - REWARD_TOLERANCE)
        else:
            summary.changed += 1

    def _fail(self, stored: dict[str, Any], failure_class: str, message: str) -> None:
        self._failures.write(
            {
                TASK_INDEX_KEY: stored[TASK_INDEX_KEY],
                ROLLOUT_INDEX_KEY: stored[ROLLOUT_INDEX_KEY],
                AGENT_REF_KEY: stored.get(AGENT_REF_KEY),
                FAILURE_CLASS_KEY: failure_class,
                FAILURE_MESSAGE_KEY: message,
                PREVIOUS_REWARD_KEY: stored.get("reward"),
            }
        )
        self.summary.failed += 1
        self.summary.failure_classes[failure_class] += 1


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sort_in_place(path: Path) -> None:
    """Order the new rollouts by (task, rollout), as the stored file's readers expect, not by completion."""
    if not path.exists():
        return
    index = RowIndex([path])
    for line, offset, length, row in iter_jsonl_spans(path):
        index.add(0, line, offset, length, row)
    index.write_sorted(path)


def reverify_rollouts(
    plan: ReverifyPlan, config: ComposedConfig | DictConfig, routes: dict[str, str] | None = None
) -> ReverifySummary:
    """Re-verify against the servers of ``config`` (already running, ports assigned), then aggregate the metrics.

    ``routes`` (agent -> resources server) defaults to the agents' ``resources_server`` in ``config``; pass it when
    ``config`` holds only the verifying servers (see :func:`config_for_reverify`).
    """
    composed = ComposedConfig.of(config)
    if routes is None:
        routes = verifier_of_agents(composed, list(plan.rollouts_per_agent))
    urls = server_urls(composed)

    async def run() -> ReverifySummary:
        try:
            summary = await Reverifier(plan, routes, urls).run()
            if not plan.options.disable_aggregation and summary.verified:
                # The resources server holds the environment's metric code (an agent's /aggregate_metrics only
                # forwards to it), and agents are not started for reverification.
                metric_urls = {agent: urls[server] for agent, server in routes.items() if server in urls}
                summary.metrics = await compute_metrics(encoded_rows_by_agent([summary.output_path]), metric_urls)
                summary.metrics_path = aggregate_metrics_path(summary.output_path)
                write_metrics(summary.metrics_path, summary.metrics)
            return summary
        finally:
            await http_client.close_session()

    return asyncio.run(run())
