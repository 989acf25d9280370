"""Worker-owned token staging: wire records, integrity hashes, the worker's capture and the trainer's verifier.

Separate from the complete-record ``TokenSink`` / ``TokenSource`` path: here an inference worker stages per-call
token deltas in framework storage and the model server keeps only a token-free ledger. Nothing in this package
imports a web framework or an engine.
"""

from nemo_gym.token_id_capture.staging.capture import (
    ActiveCall,
    CaptureError,
    CaptureHost,
    RolloutTokenCapture,
    StreamingUnsupportedError,
    install_capture,
)
from nemo_gym.token_id_capture.staging.digest import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    build_staging_delta,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    encode_token_ids,
    hash_token_ids,
)
from nemo_gym.token_id_capture.staging.protocols import (
    CaptureAdapter,
    StagingSink,
    StagingSource,
    WeightVersionProvider,
)
from nemo_gym.token_id_capture.staging.rebuild import (
    ExtrasCommitment,
    LinearizedRow,
    RebuildError,
    ReceiptVerificationError,
    WeightVersionSpan,
    linearize,
    verify_and_linearize,
)
from nemo_gym.token_id_capture.staging.records import (
    CallRecord,
    CaptureAdmission,
    CaptureDisposition,
    CaptureLedgerCommit,
    CaptureMode,
    CommitCoords,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCallSnapshot,
    StageResult,
    staging_key,
)
from nemo_gym.token_id_capture.staging.terminal import TerminalSelection, select_terminal_call
from nemo_gym.token_id_capture.terminal import TerminalAttribution, resolve_terminal

__all__ = [
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_VERSION",
    "STAGING_DIGEST_VERSION",
    "STAGING_SCHEMA_VERSION",
    "ActiveCall",
    "CallRecord",
    "CaptureAdapter",
    "CaptureAdmission",
    "CaptureDisposition",
    "CaptureError",
    "CaptureHost",
    "CaptureLedgerCommit",
    "CaptureMode",
    "CommitCoords",
    "ExtrasCommitment",
    "LinearizedRow",
    "ManifestFailure",
    "RebuildError",
    "ReceiptVerificationError",
    "RolloutManifest",
    "RolloutReceipt",
    "RolloutTokenCapture",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "StagingSink",
    "StagingSource",
    "StreamingUnsupportedError",
    "TerminalAttribution",
    "TerminalSelection",
    "WeightVersionProvider",
    "WeightVersionSpan",
    "build_staging_delta",
    "compute_chain_hash",
    "compute_extras_digest",
    "compute_staging_digest",
    "encode_token_ids",
    "hash_token_ids",
    "install_capture",
    "linearize",
    "resolve_terminal",
    "select_terminal_call",
    "staging_key",
    "verify_and_linearize",
]
