"""The reserved ``_ng_*`` fields of a rollout row, defined once for every layer that reads or writes them.

The collector stamps the indices, agents and resources servers set the routing fields, and the model-call capture
keys its files by the rollout id. They live this low so that the server kit (``judge_failsafe``, the agents' capture
correlation) and the collector agree on one spelling without the server kit importing the collector.
"""

from __future__ import annotations

from nemo_gym.metrics import ROLLOUT_INDEX_KEY_NAME as ROLLOUT_INDEX_KEY
from nemo_gym.metrics import TASK_INDEX_KEY_NAME as TASK_INDEX_KEY

__all__ = [
    "REWARD_TOLERANCE",
    "ATTEMPT_INDEX_KEY",
    "ENVIRONMENT_SERVER_KEY",
    "FAILURE_CLASS_KEY",
    "FAILURE_KIND_KEY",
    "FAILURE_MESSAGE_KEY",
    "FAILURE_STAGE_KEY",
    "FAILURE_HTTP_STATUS_KEY",
    "FAILURE_RESPONSE_BODY_KEY",
    "FAILURE_TERMINAL_KEY",
    "NO_PERSIST_KEY",
    "ROLLOUT_ID_KEY",
    "ROLLOUT_INDEX_KEY",
    "ROLLOUT_SECONDS_KEY",
    "ROLLOUT_STARTED_AT_KEY",
    "TASK_INDEX_KEY",
]

ATTEMPT_INDEX_KEY = "_ng_attempt_index"
"""How many failed attempts came before this one (absent on the first)."""
ROLLOUT_ID_KEY = "_ng_rollout_id"
"""An explicit rollout id; without it the id is ``<task>-<rollout>`` (``-a<attempt>`` on a retry)."""
FAILURE_CLASS_KEY = "_ng_failure_class"
"""Set on a result that is a failure: it goes to ``<stem>_failures.jsonl``, never to the rollouts."""
FAILURE_MESSAGE_KEY = "_ng_failure_message"
ENVIRONMENT_SERVER_KEY = "_ng_environment_server"
"""The environment server a rollout went through, when one fronted its agent (``rollouts/routing.py``)."""
FAILURE_HTTP_STATUS_KEY = "_ng_failure_http_status"
"""The HTTP status of an agent's ``/run`` answer that was not a result (absent when there was no answer)."""
FAILURE_RESPONSE_BODY_KEY = "_ng_failure_response_body"
"""The start of that answer's body (at most 2,000 characters), as the agent sent it."""
FAILURE_KIND_KEY = "failure_kind"
"""A failure's kind from ``nemo_gym.failure_kinds`` (what is counted); ``_ng_failure_class`` is which hop failed."""
FAILURE_STAGE_KEY = "_ng_failure_stage"
"""Where in the episode it failed (``seed``, ``agent``, ``verification``, ...), when known."""
FAILURE_TERMINAL_KEY = "_ng_failure_terminal"
"""A failure that retrying cannot fix: resume does not run the rollout again, whatever the attempt count."""
NO_PERSIST_KEY = "_ng_no_persist"
"""A result written nowhere (an infrastructure failure such as a killed sandbox): resume runs it again, and the
attempt does not count against the cap."""
ROLLOUT_STARTED_AT_KEY = "_ng_rollout_started_at"
"""When the collector sent the rollout (seconds since the epoch), stamped only when asked (``gym env loadtest``)."""
ROLLOUT_SECONDS_KEY = "_ng_rollout_seconds"
"""How long the rollout took as the collector saw it, retries after a server restart included (with the above)."""

REWARD_TOLERANCE = 1e-9
"""Two rewards closer than this are the same reward (a float through JSON and back is not always bit-identical):
reverify, ATIF reverification and verifier fixtures all compare with it."""
