"""The read-only control route a training framework polls for a rollout's capture manifest.

Why on the model server: with external staging the ledger (which calls were committed, which poisoned) lives where
the calls were served, and the framework decides from it which staged records to fetch. The manifest names staging
keys, so it is guarded by a bearer secret that only the framework holds (``token_id_capture.control_auth_token_env``).
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Header, HTTPException

from nemo_gym.token_id_capture.protocols import CaptureLedger

CONTROL_ROUTE_PREFIX = "/training-token-capture/control"


def install_rollout_control_routes(app: Any, lineage_store: CaptureLedger, *, auth_token: str) -> None:
    """Add ``GET <CONTROL_ROUTE_PREFIX>/rollouts/<id>/manifest`` (401 without ``Authorization: Bearer <token>``)."""
    if not auth_token:
        raise ValueError("the rollout control routes need a non-empty bearer token")
    expected = f"Bearer {auth_token}".encode()
    router = APIRouter(prefix=CONTROL_ROUTE_PREFIX)

    @router.get("/rollouts/{rollout_id}/manifest")
    async def rollout_manifest(rollout_id: str, authorization: str | None = Header(default=None)) -> dict[str, Any]:
        # Constant-time comparison: the bearer is the only thing guarding staging keys.
        if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
            raise HTTPException(status_code=401, detail="missing or wrong control bearer token")
        try:
            return await lineage_store.manifest(rollout_id)
        except ValueError as error:  # an unusable rollout id
            raise HTTPException(status_code=400, detail=str(error)) from error

    app.include_router(router)
