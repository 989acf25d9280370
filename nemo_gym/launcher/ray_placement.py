"""A launch on a Ray cluster: the same servers, placed on the cluster's nodes, some of them in several replicas.

Only ``ray_head_node_address`` / ``--ray-address`` leads here (``runner.new_launcher``); Ray is imported by this
module's functions, never at import time, and by no other path. What changes against a launch on one machine:

* **Placement.** The alive nodes are ordered: the node this process runs on first (when it is part of the cluster),
  then the rest by node id. Replica ``i`` of an instance goes to node ``i mod N``; an instance without ``replicas``
  runs once, on the first node. One :class:`~nemo_gym.launcher.node_agent.NodeAgent` actor per node used binds the
  ports there, builds the venvs there (or uses its own interpreter with ``shared_venv``) and spawns our normal
  server processes, each in its own venv, as the launcher does on one machine.
* **Names.** A replicated instance ``x`` runs as ``x@0``, ``x@1``, ...: those names appear in ``gym env status``
  (with the node each runs on), in the logs and in the collector's breakers. The config keeps the instance's own
  name, and its address is replica 0's.
* **Who talks to whom.** Each node gets its own copy of the config, in which an instance that has a replica on that
  node points at that replica: an agent replica calls the resources server replica beside it, and the instances that
  run once (a model server) wherever they run. So a node is a self-contained slice, and losing one loses only its
  slice; the collector (``rollouts/replicas.py``) spreads rows over the agent replicas and routes around a lost one.
* **Lifetimes.** Servers die with their node's actor (parent-death signal), actors die with this process (Ray's
  fate sharing of non-detached actors), and :meth:`RayLauncher.stop` stops them in order first.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from omegaconf import OmegaConf

from nemo_gym.config import ports
from nemo_gym.config.compose import ComposedConfig
from nemo_gym.config.placement import REPLICAS_KEY
from nemo_gym.config.roots import child_env
from nemo_gym.errors import ConfigError
from nemo_gym.launcher.node_agent import NodeAgent, ServerSpec
from nemo_gym.launcher.processes import LogSink
from nemo_gym.launcher.runner import Launcher, ServerLaunchError, ServerProcess, _readdressed, spawn_order
from nemo_gym.transport import access

__all__ = ["RayLauncher", "connect", "ordered_nodes", "replica_names"]

_CALL_TIMEOUT_S = 60.0
"""A node agent answers in milliseconds; a minute means its node is gone or wedged."""
_NAMESPACE = "nemo_gym"


def replica_names(instance: str, replicas: int) -> list[str]:
    """``[instance]`` for one copy, else ``instance@0 .. instance@{replicas-1}``."""
    return [instance] if replicas <= 1 else [f"{instance}@{i}" for i in range(replicas)]


def ordered_nodes(nodes: list[dict[str, Any]], own_node_id: str | None) -> list[dict[str, Any]]:
    """Alive nodes, this process's node first, then by node id: a stable order for ``i mod N`` placement."""
    alive = sorted((n for n in nodes if n.get("Alive")), key=lambda n: str(n["NodeID"]))
    return sorted(alive, key=lambda n: n["NodeID"] != own_node_id)


def _ray_initialized() -> bool:
    """Whether this process already joined a cluster (a trainer's own ``ray.init``): then it is left joined."""
    import sys

    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def connect(address: str) -> Any:
    """Join the cluster at ``address`` (once per process) and return the ``ray`` module."""
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            f"--ray-address / ray_head_node_address is set ({address}) but Ray is not installed: "
            "pip install 'nemo-gym[ray]'"
        ) from e
    if not ray.is_initialized():
        try:
            ray.init(address=address, namespace=_NAMESPACE, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConfigError(
                f"cannot join the Ray cluster at {address} (ray_head_node_address / --ray-address): {e}. "
                "Start it with `ray start --head`, or fix the address"
            ) from e
    return ray


class RayLauncher(Launcher):
    """:class:`Launcher` whose servers run on a Ray cluster's nodes; see the module docstring."""

    places_replicas = True

    def __init__(self, config: ComposedConfig, address: str, **options: Any) -> None:
        super().__init__(config, **options)
        self.address = address
        self._ray: Any = None
        self._agents: dict[str, Any] = {}
        """Node id -> its NodeAgent actor handle."""
        self._node_labels: dict[str, str] = {}
        self._lost: set[str] = set()
        self._connected_here = False

    # -- steps of start() ----------------------------------------------------------------------------------------

    def _plan(self) -> None:
        super()._plan()  # directories, entrypoints, sinks; its local port reservations are not used here
        ports.release_all()
        self._released_ports = True
        self._connected_here = not _ray_initialized()
        self._ray = connect(self.address)
        nodes = ordered_nodes(self._ray.nodes(), self._ray.get_runtime_context().get_node_id())
        if not nodes:
            raise ServerLaunchError(f"the Ray cluster at {self.address} has no alive node")
        placed: list[ServerProcess] = []
        for server in self.servers:
            inner = self._inner(server.name)
            count = int(inner.pop(REPLICAS_KEY, None) or 1)
            server.sink.close()  # the node writes the server's own log; the launcher's notes go to logs/launcher/
            server.sink.path.unlink(missing_ok=True)
            for i, name in enumerate(replica_names(server.name, count)):
                node = nodes[i % len(nodes)]
                node_id = str(node["NodeID"])
                self._node_labels[node_id] = f"{node['NodeManagerAddress']}/{node_id[:8]}"
                sink = LogSink(name, self.log_dir / "launcher" / f"{name}.log", self.echo, self._mask_log_line)
                replica = copy.copy(server)
                replica.name, replica.instance, replica.sink = name, server.name, sink
                replica.node = self._node_labels[node_id]
                replica.log_path = self.log_dir / f"{name}.log"  # written by its node (a shared results_dir here)
                placed.append(replica)
                self._agent(node_id)
        self.servers = placed
        for node_id, agent in self._agents.items():
            hosts = {s.name: s.host for s in self._on(node_id)}
            addresses = self._call(agent.reserve.remote(hosts), f"reserving ports on node {self._node_labels[node_id]}")
            for server in self._on(node_id):
                server.host, server.port = addresses[server.name]
        for index, instance in enumerate(self._instances):
            primary = next(s for s in self.servers if s.instance == instance.name)
            inner = self._inner(instance.name)
            inner["host"], inner["port"] = primary.host, primary.port
            self._instances[index] = _readdressed(instance.name, self._data[instance.name])

    def _prepare_interpreters(self, deadline: float) -> None:
        """Nothing here: each node builds (or reuses) its servers' venvs when it starts them."""

    def _spawn_all(self) -> None:
        env = child_env({})  # --search-dir roots reach every node's servers
        for node_id, agent in self._agents.items():
            specs = [self._spec(server) for server in self._on(node_id)]
            text = OmegaConf.to_yaml(OmegaConf.create(self._node_config(node_id)))
            where = self._node_labels[node_id]
            for server in self._on(node_id):
                server.sink.note(
                    f"starting on node {where} as {server.url} (its log: {self.log_dir / server.name}.log)"
                )
            pids = self._call(agent.start.remote(text, specs, env), f"starting servers on node {where}")
            started = datetime.now(UTC).isoformat(timespec="seconds")
            for server in self._on(node_id):
                server.remote_pid, server.started_at = pids[server.name], started

    def raise_for_exited(self, during_startup: bool = False) -> None:
        """During startup any exited server fails the launch. Later, a lost replica is noted and left out, and only
        an instance with no replica left fails (``gym env start`` then stops)."""
        for node_id, agent in self._agents.items():
            where = self._node_labels[node_id]
            try:
                exited = self._call(agent.exited.remote(), f"asking node {where}")
            except ServerLaunchError:
                exited = {s.name: -9 for s in self._on(node_id)}  # the node (or its agent) is gone
            for name, code in exited.items():
                server = next(s for s in self.servers if s.name == name)
                if during_startup:
                    tail = "\n".join(f"  | {line}" for line in self._tail(agent, name))
                    raise ServerLaunchError(
                        f"server {name!r} ({server.label}) on node {where} exited with code {code} during startup. "
                        f"Last lines of its log {self.log_dir / name}.log:\n{tail}"
                    )
                if name not in self._lost:
                    self._lost.add(name)
                    server.sink.note(f"lost on node {where} (exit code {code})")
        for instance in {s.instance for s in self.servers}:
            if all(s.name in self._lost for s in self.servers if s.instance == instance):
                raise ServerLaunchError(f"every replica of server {instance!r} is gone (its nodes were lost)")

    def stop(self) -> None:
        if self._agents and not self._stopped:
            stopping = [agent.stop.remote(self.shutdown_grace_s) for agent in self._agents.values()]  # in parallel
            for ref in stopping:
                try:
                    self._call(ref, "stopping servers", self.shutdown_grace_s + 15)
                except ServerLaunchError:
                    pass  # the node is gone, and its servers with it
            for agent in self._agents.values():
                self._ray.kill(agent)
            self._agents.clear()
        if self._ray is not None and self._connected_here:
            self._ray.shutdown()
        super().stop()

    # -- helpers -------------------------------------------------------------------------------------------------

    def _inner(self, name: str) -> dict[str, Any]:
        instance = next(i for i in self._instances if i.name == name)
        block: dict[str, Any] = self._data[name][instance.SERVER_TYPE][instance.implementation]
        return block

    def _on(self, node_id: str) -> list[ServerProcess]:
        label = self._node_labels[node_id]
        return spawn_order([s for s in self.servers if s.node == label])

    def _agent(self, node_id: str) -> Any:
        if node_id not in self._agents:
            from ray.util.scheduling_strategies import (
                NodeAffinitySchedulingStrategy,
            )

            actor = self._ray.remote(num_cpus=0)(NodeAgent)
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            self._agents[node_id] = actor.options(scheduling_strategy=strategy).remote(str(self.log_dir))
        return self._agents[node_id]

    def _spec(self, server: ServerProcess) -> ServerSpec:
        return ServerSpec(
            name=server.name, instance=server.instance, server_type=server.server_type,
            implementation=server.implementation, impl_dir=str(server.impl_dir), root=str(server.root),
            entrypoint=str(server.entrypoint), shared_venv=self.shared_venv, cache_dir=str(self.cache_dir),
            python_version=str(self._data.get("python_version") or ""),
        )  # fmt: skip

    def _node_config(self, node_id: str) -> dict[str, Any]:
        """The config as this node's servers see it: each instance at its replica on this node, if it has one."""
        data = copy.deepcopy(self._data)
        local = {s.instance: s for s in self._on(node_id)}
        for instance in self._instances:
            if instance.name in local:
                inner = data[instance.name][instance.SERVER_TYPE][instance.implementation]
                inner["host"], inner["port"] = local[instance.name].host, local[instance.name].port
        if self._token is not None:
            data[access.RUN_TOKEN_KEY] = self._token
        return data

    def _tail(self, agent: Any, name: str) -> list[str]:
        try:
            return list(self._call(agent.tail.remote(name), "reading a log"))
        except ServerLaunchError:
            return []

    def _call(self, ref: Any, doing: str, timeout_s: float = _CALL_TIMEOUT_S) -> Any:
        """``ray.get`` with a deadline; a lost node or actor becomes a :class:`ServerLaunchError`."""
        try:
            return self._ray.get(ref, timeout=timeout_s)
        except Exception as e:  # RayActorError, GetTimeoutError, a failure inside the agent: all name the step
            raise ServerLaunchError(f"Ray: {doing} failed: {type(e).__name__}: {str(e)[:500]}") from e
