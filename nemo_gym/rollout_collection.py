"""The programmatic face of rollout collection, for RL frameworks that drive rollouts themselves.

``gym eval run`` is the command-line path (:mod:`nemo_gym.rollouts`). A trainer instead hands rows to
:class:`RolloutCollectionHelper` and consumes results as they finish, doing its own batching; the servers are found
through the head server (or the config this process already has). Each rollout goes through the collector's
:func:`~nemo_gym.rollouts.collector.run_rollout`, so a failure gets the same class here as in ``gym eval run``.

The ``NG_*_KEY`` names are the result fields an agent sets to route a failure (``row_fields.py``):
``NG_FAILURE_CLASS_KEY`` makes it a failure, ``NG_TERMINAL_KEY`` stops resume from retrying it, ``NG_NO_PERSIST_KEY``
keeps it out of every file so resume runs it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.errors import ConfigError
from nemo_gym.observability.trajectory import TRAJECTORY_KEY as NG_TRAJECTORY_KEY
from nemo_gym.observability.trajectory import attach_trajectory_record as _attach_trajectory_record
from nemo_gym.rollouts.collector import RolloutFailure as _RolloutFailure
from nemo_gym.rollouts.collector import default_max_attempts as _get_max_rollout_attempts
from nemo_gym.rollouts.collector import run_rollout as _run_rollout
from nemo_gym.rollouts.config import DEFAULT_CONCURRENCY as _DEFAULT_CONCURRENCY
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.row_fields import FAILURE_CLASS_KEY as NG_FAILURE_CLASS_KEY
from nemo_gym.row_fields import FAILURE_TERMINAL_KEY as NG_TERMINAL_KEY
from nemo_gym.row_fields import NO_PERSIST_KEY as NG_NO_PERSIST_KEY
from nemo_gym.server_utils import ServerClient
from nemo_gym.transport.admission import in_admitted_request as _in_admitted_request

__all__ = [
    "AGENT_REF_KEY",
    "BaseServerConfig",
    "ConfigError",
    "NG_FAILURE_CLASS_KEY",
    "NG_NO_PERSIST_KEY",
    "NG_TERMINAL_KEY",
    "NG_TRAJECTORY_KEY",
    "RolloutCollectionConfig",
    "RolloutCollectionHelper",
    "ServerClient",
    "_attach_trajectory_record",
    "_get_max_rollout_attempts",
]


class RolloutCollectionHelper:
    """Run rows through their agents' ``/run`` and yield ``(row, result)`` in completion order."""

    def __init__(self, server_client: ServerClient | None = None) -> None:
        self._client = server_client

    def _server_client(self, head_server_config: BaseServerConfig | None) -> ServerClient:
        if self._client is None:
            self._client = ServerClient.load_from_global_config(head_server_config)
        return self._client

    async def run_examples(
        self,
        rows: Iterable[dict[str, Any]],
        head_server_config: BaseServerConfig | None = None,
        semaphore: asyncio.Semaphore | None = None,
    ) -> AsyncIterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Each row needs ``agent_ref`` (``{"name": ...}``). ``rows`` is one batch: all of it is scheduled at once and
        at most ``semaphore`` rollouts are in flight (default: the default of ``gym eval run --concurrency``).

        A failed rollout yields a result with ``_ng_failure_class`` / ``_ng_failure_message`` instead of raising, so
        one bad row never stops a batch; the classes and rules are the collector's (``timeout``, ``verify_failed``,
        ``invalid_response``, ...). A row without ``agent_ref``, or naming no server of the config, is a
        ``ConfigError``."""
        client = self._server_client(head_server_config)
        limit = semaphore or asyncio.Semaphore(_DEFAULT_CONCURRENCY)

        async def run_one(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
            ref = row.get(AGENT_REF_KEY)
            name = ref.get("name") if isinstance(ref, dict) else ref
            if not name:
                raise ConfigError("every row needs agent_ref: {name: <agent instance>}")
            async with limit:
                url = client.server_base_url(name)
                result = await _run_rollout(url, name, row, nested=_in_admitted_request())
            return row, result.as_result() if isinstance(result, _RolloutFailure) else result

        pending = {asyncio.ensure_future(run_one(row)) for row in rows}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    yield task.result()
        finally:
            for task in pending:
                task.cancel()
