"""Where servers run: the two config keys of a launch on a Ray cluster, named and typed once.

* ``ray_head_node_address`` (top level; ``--ray-address`` on ``gym env start`` and ``gym eval run``): the address of
  a running Ray cluster (``HOST:PORT`` of its head, or ``auto``). Unset, nothing about a launch changes and Ray is
  never imported; set, ``launcher/ray_placement.py`` places the servers on the cluster's nodes.
* ``replicas`` (in a server block, next to ``entrypoint``): how many copies of that instance to start, spread over
  the nodes in turn. Only a Ray launch starts more than one.
"""

from __future__ import annotations

RAY_ADDRESS_KEY = "ray_head_node_address"
DEFAULT_RAY_ADDRESS: str | None = None
"""No cluster: every server on this machine, no Ray."""
REPLICAS_KEY = "replicas"
DEFAULT_REPLICAS = 1

__all__ = ["DEFAULT_RAY_ADDRESS", "DEFAULT_REPLICAS", "RAY_ADDRESS_KEY", "REPLICAS_KEY"]
