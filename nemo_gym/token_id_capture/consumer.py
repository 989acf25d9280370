"""A finished rollout's capture as a trainable result: freeze the records, attribute the terminal, build, decide.

The result dict says ``rebuilt_response`` (the main chain as a Responses object with token ids), ``mask_sample``
(true whenever training on it would be unsafe: an incomplete or empty capture, a broken or ambiguous chain) and
``metrics`` about the build. The snapshot id and version come back under ``_capture_snapshot`` so the caller retires
exactly what it consumed, and only after it handed the result on; nothing here deletes records.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from nemo_gym.token_id_capture.builder import assert_prefix_contiguity, project_main_chain_response, run_builder
from nemo_gym.token_id_capture.protocols import TokenCaptureSnapshot, TokenSource
from nemo_gym.token_id_capture.records import TokenEntry
from nemo_gym.token_id_capture.store import TokenCaptureStore
from nemo_gym.token_id_capture.terminal import TerminalAttribution, resolve_terminal

logger = logging.getLogger(__name__)

_BUILD_ERRORS = (AssertionError, ValueError, KeyError, IndexError, TypeError)


def _masked(rollout_id: str, builder: str, error: str, n_calls: int = 0) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "builder": builder,
        "rebuilt_response": None,
        "mask_sample": True,
        "error": error,
        "metrics": {"n_calls": n_calls},
    }


def token_id_capture_dirs_from_config(global_config_dict: Any) -> list[Path]:
    """The file store's directory as a one-element list, or [] when capture is off or a custom sink owns records."""
    from nemo_gym.token_id_capture.config import token_id_capture_config

    config = token_id_capture_config(global_config_dict)
    directory = config.resolved_dir()
    if not config.enabled or config.token_id_capture.sink is not None or directory is None:
        return []
    return [directory]


def clear_token_captures(rollout_ids: list[str], token_capture_dirs: list[Path]) -> None:
    """Forget earlier records of rollout ids about to be dispatched again (ids are deterministic, files append)."""
    for directory in token_capture_dirs:
        store = TokenCaptureStore(directory)
        for rollout_id in rollout_ids:
            store.delete(rollout_id)


def _attribution_metric(attribution: TerminalAttribution, chain: str) -> dict[str, Any]:
    return {
        "method": attribution.method or "none",
        "call_id": attribution.model_call_id,
        "reason": attribution.reason,
        "chain": chain,
    }


def build_trajectory(
    rollout_id: str,
    entries: list[TokenEntry],
    *,
    builder: str = "prefix_merging",
    model: str = "",
    verified_response: dict[str, Any] | None = None,
    explicit_terminal_call_id: str | None = None,
    declared_response_id: str | None = None,
) -> dict[str, Any]:
    """Build one rollout's result from its entries (a malformed capture is masked, never raised)."""
    if not entries:
        return _masked(rollout_id, builder, "the capture holds no token records")
    attribution = resolve_terminal(
        entries, verified_response, explicit_terminal_call_id, declared_response_id=declared_response_id
    )
    try:
        out = run_builder(entries, builder, terminal_call_id=attribution.model_call_id)
        for chain in out.chains:
            chain.validate()
        response = project_main_chain_response(rollout_id, out, model=model)
        assert_prefix_contiguity(response)
    except _BUILD_ERRORS as error:
        logger.warning("no trajectory for rollout %s from %d calls: %s", rollout_id, len(entries), error)
        failed = _masked(rollout_id, builder, f"{type(error).__name__}: {error}", len(entries))
        failed["metrics"]["terminal_attribution"] = _attribution_metric(attribution, "error")
        return failed
    notes = out.notes
    if notes.terminal_chain == "delivered":
        mask = False  # the scored chain is intact; off-path calls are simply not delivered
    elif attribution.attributed or declared_response_id:
        mask = True  # a named terminal whose chain cannot be delivered
    else:
        doubtful = notes.unresolved_retries or notes.unresolved_parent_calls or out.quarantined
        mask = bool(doubtful) or notes.roots != 1 or notes.chains != 1
    mask = mask or not any(item.get("generation_token_ids") for item in response["output"])
    return {
        "rollout_id": rollout_id,
        "builder": builder,
        "rebuilt_response": response,
        "mask_sample": mask,
        "unresolved_retries": list(notes.unresolved_retries),
        "unresolved_parent_calls": list(notes.unresolved_parent_calls),
        "metrics": {
            "n_calls": len(entries),
            "terminal_attribution": _attribution_metric(attribution, notes.terminal_chain),
            "chains": notes.chains,
            "roots": notes.roots,
            "quarantined_calls": len(out.quarantined),
            "quarantined_fraction": round(len(out.quarantined) / len(entries), 4),
            "delivered_fraction": notes.delivered_fraction,
            "generated_tokens_captured": notes.generated_tokens_captured,
            "generated_tokens_delivered": notes.generated_tokens_delivered,
            "parent_link_failures": dict(notes.parent_link_failures),
            "unresolved_parent_calls": len(notes.unresolved_parent_calls),
            "empty_generation_calls": len(notes.empty_generation_calls),
        },
    }


def _with_snapshot(built: dict[str, Any], snapshot: TokenCaptureSnapshot) -> dict[str, Any]:
    if snapshot.incomplete:
        built["mask_sample"] = True
        built.setdefault("metrics", {})["capture_incomplete"] = True
    built["_capture_snapshot"] = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}
    return built


async def trajectories_from_source(
    rollout_id: str,
    source: TokenSource,
    *,
    builder: str = "prefix_merging",
    model: str = "",
    verified_response: dict[str, Any] | None = None,
    explicit_terminal_call_id: str | None = None,
    declared_response_id: str | None = None,
) -> dict[str, Any] | None:
    """Freeze ``source``'s records of the rollout and build its result (see the module docstring)."""
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as error:
        logger.warning("cannot freeze the token capture of rollout %s", rollout_id, exc_info=True)
        return _masked(rollout_id, builder, f"{type(error).__name__}: {error}")
    built = await asyncio.to_thread(
        build_trajectory,
        rollout_id,
        list(snapshot.entries),
        builder=builder,
        model=model,
        verified_response=verified_response,
        explicit_terminal_call_id=explicit_terminal_call_id,
        declared_response_id=declared_response_id,
    )
    return _with_snapshot(built, snapshot)


def trajectories_for_rollout(
    rollout_id: str,
    token_capture_dirs: list[Path],
    *,
    builder: str = "prefix_merging",
    model: str = "",
    verified_response: dict[str, Any] | None = None,
    explicit_terminal_call_id: str | None = None,
) -> dict[str, Any] | None:
    """The same from the run's file store (synchronous); None only when no capture directory is configured."""
    for directory in token_capture_dirs:
        try:
            snapshot = TokenCaptureStore(directory).freeze_now(rollout_id)
        except Exception as error:
            logger.warning("cannot freeze the token capture of rollout %s", rollout_id, exc_info=True)
            return _masked(rollout_id, builder, f"{type(error).__name__}: {error}")
        built = build_trajectory(
            rollout_id,
            list(snapshot.entries),
            builder=builder,
            model=model,
            verified_response=verified_response,
            explicit_terminal_call_id=explicit_terminal_call_id,
        )
        return _with_snapshot(built, snapshot)
    return None
