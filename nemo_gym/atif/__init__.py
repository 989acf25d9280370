"""ATIF v1.7 (Harbor's agent-trajectory interchange format, RFC 0001): export rollouts, and score an export again.

``schema`` is our model of the format, ``strict_json`` the JSON reading it needs, ``from_rollout`` / ``to_response``
the two directions of the mapping between a rollout row and a trajectory, ``export`` the folder ``gym eval export``
writes and ``reverify`` what ``gym eval reverify --atif-manifest`` reads back.
"""

DEFAULT_AGENT_VERSION = "unspecified"
"""``--agent-version`` when none is given: ATIF requires a version, and a rollout does not record its agent's."""
