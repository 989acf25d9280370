"""What a framework plugs into worker-owned staging: storage (``StagingSink`` / ``StagingSource``), the policy
version, and the engine translation (``CaptureAdapter``).

Synchronous on purpose: inference workers call these from completion hooks, possibly from several threads at once,
so an implementation synchronises its own state and moves any async storage off its event loop itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.staging.records import StagedCallBaseSnapshot, StagedCallRecord, StageResult


@runtime_checkable
class StagingSink(Protocol):
    """Makes one staged call durable before reporting success; ``attachments`` (opaque framework payloads such as
    media tensors) go in the same write or the call is refused, never silently dropped."""

    def stage(self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None) -> StageResult: ...


@runtime_checkable
class StagingSource(Protocol):
    """Returns one base snapshot per staging key, in the order asked (extras stay behind the key)."""

    def fetch(self, staging_keys: list[str]) -> list[StagedCallBaseSnapshot]: ...


@runtime_checkable
class WeightVersionProvider(Protocol):
    """The trainer's current policy version, stamped on a call when it is admitted."""

    def __call__(self) -> int: ...


class CaptureAdapter(Protocol):
    """Reads and writes one engine's native payloads; never fetches staged records itself."""

    def enter_prefix(self, request_payload: dict[str, Any], prefix_ids: list[int]) -> dict[str, Any]:
        """Put an already resolved exact prefix on an engine request."""
        ...

    def extract_prompt_ids(self, response_payload: Any) -> list[int]:
        """The prompt ids the engine actually generated from."""
        ...

    def extract_generation(self, response_payload: Any) -> tuple[list[int], list[float]]:
        """Generated ids and their log-probs."""
        ...

    def extract_extras(self, response_payload: Any) -> dict[str, Any] | None:
        """Optional per-token engine material (e.g. routed experts)."""
        ...


def install_capture(
    serving_layer: Any,
    *,
    sink: StagingSink,
    weight_version_fn: WeightVersionProvider,
    adapter: CaptureAdapter | None = None,
) -> Any:
    """Give a serving layer its ``RolloutTokenCapture`` (see ``staging.capture.install_capture``)."""
    from nemo_gym.token_id_capture.staging.capture import install_capture as install

    return install(serving_layer, sink=sink, weight_version_fn=weight_version_fn, adapter=adapter)
