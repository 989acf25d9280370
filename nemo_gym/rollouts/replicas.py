"""Spreading rows over the replicas of an agent (a launch on a Ray cluster), around the ones that are down.

An agent instance placed in several replicas (``replicas: N``, ``launcher/ray_placement.py``) is one agent to the
rows: they name the instance. Each rollout goes to the replica with the fewest rollouts in flight, which spreads rows
evenly and sends more to a replica that answers faster. A replica the breakers found down, or one on a node where any
server was found down, gets no new rows; the rollouts it failed are run again on another replica
(``rollouts/breaker.py`` decides that they are not charged). Without replicas, :meth:`Router.pick` gives the agent's
one URL and nothing else changes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from nemo_gym.rollouts.breaker import Server

__all__ = ["Router"]


class Router:
    """Picks the server of an agent a rollout goes to; ``served`` counts the rollouts each replica scored (agents
    without replicas are not counted)."""

    def __init__(
        self,
        agent_urls: dict[str, str],
        servers: list[Server],
        is_down: Callable[[str], bool],
        down_nodes: Callable[[], set[str]],
    ) -> None:
        self._urls = agent_urls
        self._replicas: dict[str, list[Server]] = {}
        for server in servers:
            if server.kind == "responses_api_agents" and server.group:
                self._replicas.setdefault(server.group, []).append(server)
        self._replica_names = {r.name for group in self._replicas.values() if len(group) > 1 for r in group}
        self._is_down = is_down
        self._down_nodes = down_nodes
        self._in_flight: Counter[str] = Counter()
        self.served: Counter[str] = Counter()

    def replicated(self, agent: str) -> bool:
        return len(self._replicas.get(agent, ())) > 1

    def pick(self, agent: str) -> tuple[str, str | None]:
        """``(server name, base URL)`` for the next rollout of ``agent``: the least busy replica that is up (all
        down: the least busy of them, whose failure the breakers then judge); without replicas, the agent itself."""
        replicas = self._replicas.get(agent)
        if not replicas or len(replicas) == 1:
            name = replicas[0].name if replicas else agent
            return name, replicas[0].url if replicas else self._urls.get(agent)
        lost = self._down_nodes()
        up = [r for r in replicas if not self._is_down(r.name) and r.node not in lost] or replicas
        chosen = min(up, key=lambda r: self._in_flight[r.name])
        self._in_flight[chosen.name] += 1
        return chosen.name, chosen.url

    def release(self, name: str, scored: bool) -> None:
        """A rollout sent to ``name`` ended (``scored``: with a reward)."""
        if self._in_flight[name] > 0:
            self._in_flight[name] -= 1
        if scored and name in self._replica_names:
            self.served[name] += 1
