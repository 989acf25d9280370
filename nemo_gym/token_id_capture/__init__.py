"""Training-token capture (NeMo Gym 0.7's ``nemo_gym.token_id_capture``): the exact prompt and generated token ids
of every model call a rollout makes, recorded per rollout so a trainer gets them back as one verified sequence.

Why a package of its own: evaluation capture (``observability/``) keeps what was said; training needs what the
policy saw and sampled, token for token, and must refuse to train on a chain it cannot prove. A model server's
middleware (``observability/token_capture.py``) opens a ``CaptureContext`` for calls made under
``/ng-rollout/<id>/training-token-capture/``; ``resolve_parent`` decides which recorded call a request continues;
``capture_tokens`` writes a ``TokenEntry`` to a ``TokenSink`` (Gym's ``TokenCaptureStore``, or a framework's);
``trajectories_from_source`` freezes a rollout's records and rebuilds its main chain. ``staging/`` is the other mode,
where a framework inference worker stages the tokens and the model server keeps a token-free ledger. This package
imports no server code.
"""

from nemo_gym.token_id_capture.builder import (
    Chain,
    assert_prefix_contiguity,
    prefix_merging,
    project_chain_to_output_items,
    project_main_chain_response,
    run_builder,
)
from nemo_gym.token_id_capture.config import TokenIdCaptureConfig
from nemo_gym.token_id_capture.consumer import (
    token_id_capture_dirs_from_config,
    trajectories_for_rollout,
    trajectories_from_source,
)
from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint, canonicalize_tool_arguments
from nemo_gym.token_id_capture.lineage import (
    FileLineageStore,
    InMemoryLineageStore,
    RolloutLineage,
    stamp_continuation,
)
from nemo_gym.token_id_capture.protocols import (
    CaptureLedger,
    LineageMatch,
    LineageResolution,
    LineageResolver,
    TokenCaptureSnapshot,
    TokenSink,
    TokenSource,
    install_lineage_store,
    install_token_sink,
    install_token_source,
    installed_lineage_store,
    installed_token_sink,
    installed_token_source,
)
from nemo_gym.token_id_capture.records import (
    TOKEN_ENTRY_MIN_SCHEMA_VERSION,
    TOKEN_ENTRY_RECORD_SCHEMA_VERSION,
    TOKEN_FIELDS,
    UNCOMMITTED_CALL_REASON,
    UNRESOLVED_PARENT_REASON,
    ParentResolutionStatus,
    TokenEntry,
    compute_digest,
    cumulative_tokens,
    extract_token_fields,
    stamp_lineage,
)
from nemo_gym.token_id_capture.sink import (
    NG_CAPTURE_FIELD,
    NG_COMMIT_COORDS_FIELD,
    CaptureContext,
    capture_health_snapshot,
    capture_tokens,
    commit_entry,
    current_capture_context,
    mark_external_staging_committed,
    register_call_intent,
    reset_token_sink,
    resolve_parent,
    set_token_sink,
)
from nemo_gym.token_id_capture.staging.records import CallRecord, CaptureLedgerCommit
from nemo_gym.token_id_capture.store import TokenCaptureStore, make_token_store, validate_rollout_id

__all__ = [
    "NG_CAPTURE_FIELD",
    "NG_COMMIT_COORDS_FIELD",
    "TOKEN_ENTRY_MIN_SCHEMA_VERSION",
    "TOKEN_ENTRY_RECORD_SCHEMA_VERSION",
    "TOKEN_FIELDS",
    "UNCOMMITTED_CALL_REASON",
    "UNRESOLVED_PARENT_REASON",
    "CallRecord",
    "CaptureContext",
    "CaptureLedger",
    "CaptureLedgerCommit",
    "Chain",
    "FileLineageStore",
    "InMemoryLineageStore",
    "LineageMatch",
    "LineageResolution",
    "LineageResolver",
    "ParentResolutionStatus",
    "RolloutLineage",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenIdCaptureConfig",
    "TokenSink",
    "TokenSource",
    "assert_prefix_contiguity",
    "assistant_fingerprint",
    "canonicalize_tool_arguments",
    "capture_health_snapshot",
    "capture_tokens",
    "commit_entry",
    "compute_digest",
    "cumulative_tokens",
    "current_capture_context",
    "extract_token_fields",
    "install_lineage_store",
    "install_token_sink",
    "install_token_source",
    "installed_lineage_store",
    "installed_token_sink",
    "installed_token_source",
    "make_token_store",
    "mark_external_staging_committed",
    "prefix_merging",
    "project_chain_to_output_items",
    "project_main_chain_response",
    "register_call_intent",
    "reset_token_sink",
    "resolve_parent",
    "run_builder",
    "set_token_sink",
    "stamp_continuation",
    "stamp_lineage",
    "token_id_capture_dirs_from_config",
    "trajectories_for_rollout",
    "trajectories_from_source",
    "validate_rollout_id",
]
