"""The run's ``token_id_capture`` block: whether model calls under ``/ng-rollout/<id>/training-token-capture/`` record
their token ids, where the records go, and who reads them back.

.. code-block:: yaml

    token_id_capture:
      enabled: true
      dir: /abs/path/token_captures        # else the run's model_call_capture_dir
      sink: my_pkg.sinks:MySink            # optional TokenSink replacing the file store, built per server process
      lineage_store: my_pkg.sinks:MyIndex  # required with a custom sink (same backend)
      delta_records: false                 # store resolved prompts as the suffix after the parent's tokens

Why per process: server workers are spawned, so an object installed by a launcher never reaches them; a class named
here is imported and built in each. Training capture is separate from evaluation capture (``observability_enabled``):
either can be on alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_gym.token_id_capture.protocols import (
    LineageResolver,
    TokenSink,
    installed_lineage_store,
    installed_token_sink,
)

logger = logging.getLogger(__name__)

TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
ExternalStagingBackend = Literal["vllm_worker", "megatron_worker"]


class NonGeneratingRequest(BaseModel):
    """An exact ``(method, path)`` of a model server whose answer never holds policy-generated tokens."""

    model_config = ConfigDict(extra="forbid")

    method: str
    path: str

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.isascii() or not value.isalpha():
            raise ValueError("method must be one HTTP method name")
        return value.upper()

    @field_validator("path")
    @classmethod
    def _exact(cls, path: str) -> str:
        if not path.startswith("/") or any(char in path for char in "?#*{}"):
            raise ValueError("path must be an exact absolute path: no query, fragment or wildcard")
        return path


class TokenIdCaptureSettings(BaseModel):
    """The block itself (unknown keys are refused, so a misspelt setting is not silently ignored)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    all_agents: bool = False
    """Every agent's model calls, rather than only agents whose own ``token_id_capture`` is true."""
    dir: Path | None = None
    sink: str | None = None
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    lineage_store: str | None = None
    lineage_store_kwargs: dict[str, Any] = Field(default_factory=dict)
    rebuild_response: bool = True
    """Gym rebuilds each finished rollout from its records; false when a framework reads its own source."""
    allow_unresolved_continuations: bool = False
    delta_records: bool = False
    max_mask_fraction: float | None = None
    mask_fraction_min_samples: int = 50
    external_staging: bool = False
    """A framework inference worker stages the tokens; the model server keeps only the token-free ledger."""
    external_staging_backend: ExternalStagingBackend = "vllm_worker"
    control_auth_token_env: str = Field(default="NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN", min_length=1)

    def resolve_control_auth_token(self) -> str:
        """The control routes' bearer, read from the environment so it never lands in a written config."""
        token = os.environ.get(self.control_auth_token_env)
        if not token:
            raise ValueError(
                f"token_id_capture.external_staging needs a bearer token in ${self.control_auth_token_env}"
            )
        return token


class TokenIdCaptureConfig(BaseModel):
    """The block and the one top-level key it falls back to."""

    model_config = ConfigDict(extra="ignore")

    token_id_capture: TokenIdCaptureSettings = Field(default_factory=TokenIdCaptureSettings)
    model_call_capture_dir: Path | None = None

    @model_validator(mode="after")
    def _coherent(self) -> TokenIdCaptureConfig:
        block = self.token_id_capture
        if block.external_staging:
            if not block.enabled:
                raise ValueError("token_id_capture.external_staging needs token_id_capture.enabled")
            if block.rebuild_response:
                raise ValueError(
                    "token_id_capture.external_staging needs rebuild_response: false (the framework rebuilds)"
                )
        elif block.external_staging_backend != "vllm_worker":
            raise ValueError("token_id_capture.external_staging_backend needs external_staging: true")
        if not block.enabled:
            return self  # kept as written, so a templated config can flip only `enabled`
        if block.sink is not None or (self.resolved_dir() is None and installed_token_sink() is not None):
            self._require_resolver(block)
            return self
        directory = self.resolved_dir()
        if directory is None:
            if block.rebuild_response:
                raise ValueError("token_id_capture needs a directory (dir or model_call_capture_dir) or a sink")
        elif not directory.is_absolute():
            raise ValueError(f"the token capture directory must be an absolute path, not {directory}")
        return self

    @staticmethod
    def _require_resolver(block: TokenIdCaptureSettings) -> None:
        """A custom sink without a resolver leaves every continuation unresolved: refuse unless accepted."""
        if block.lineage_store is not None or installed_lineage_store() is not None:
            return
        if not block.allow_unresolved_continuations:
            raise ValueError(
                "token_id_capture has a custom sink but no lineage_store, so no multi-call rollout could be trained; "
                "configure lineage_store on the sink's backend or set allow_unresolved_continuations: true"
            )
        logger.warning("token_id_capture: custom sink without lineage_store; multi-call rollouts will be masked")

    @property
    def enabled(self) -> bool:
        return self.token_id_capture.enabled

    def resolved_dir(self) -> Path | None:
        return self.token_id_capture.dir or self.model_call_capture_dir

    def build_sink(self) -> TokenSink | None:
        """The configured sink for this process, or None when the file store is used."""
        block = self.token_id_capture
        if not block.enabled or block.sink is None:
            return None
        sink: TokenSink = _construct(block.sink, block.sink_kwargs, TokenSink, "sink")
        return sink

    def build_lineage_store(self) -> LineageResolver | None:
        block = self.token_id_capture
        if not block.enabled or block.lineage_store is None:
            return None
        store: LineageResolver = _construct(
            block.lineage_store, block.lineage_store_kwargs, LineageResolver, "lineage_store"
        )
        return store


def _construct(target: str, kwargs: dict[str, Any], protocol: type, what: str) -> Any:
    """Import ``module:Class``, build it with ``kwargs`` and check it has every method of ``protocol``."""
    module_name, colon, class_name = target.partition(":")
    if not all((module_name, colon, class_name)):
        raise ValueError(f"token_id_capture.{what} must be 'module.path:ClassName', not {target!r}")
    # One try for both steps; ``step`` says which one failed and which errors that step turns into a ValueError.
    step: tuple[str, tuple[type[Exception], ...]] = ("cannot be imported", (ImportError, AttributeError))
    try:
        factory = getattr(import_module(module_name), class_name)
        step = (f"rejects {what}_kwargs {sorted(kwargs)}", (TypeError,))
        built = factory(**kwargs)
    except (ImportError, AttributeError, TypeError) as error:
        complaint, converted = step
        if not isinstance(error, converted):
            raise
        raise ValueError(f"token_id_capture.{what} {target!r} {complaint}: {error}") from error
    lacking = sorted(
        name for name in getattr(protocol, "__protocol_attrs__", ()) if not callable(getattr(built, name, None))
    )
    if lacking or not isinstance(built, protocol):
        raise ValueError(
            f"token_id_capture.{what} {target!r} is no {protocol.__name__}: lacks {', '.join(lacking) or '?'}"
        )
    return built


def _plain(value: Any) -> Any:
    """A composed (OmegaConf) or plain mapping as plain dicts and lists."""
    if not isinstance(value, Mapping):
        return value
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return {key: _plain(item) for key, item in value.items()}


def token_id_capture_config(global_config_dict: Any) -> TokenIdCaptureConfig:
    """The capture settings of a run's global config (None or a config without the block: capture off)."""
    source = global_config_dict if isinstance(global_config_dict, Mapping) else {}
    picked = {key: _plain(source.get(key)) for key in (TOKEN_ID_CAPTURE_BLOCK, "model_call_capture_dir")}
    return TokenIdCaptureConfig.model_validate({key: value for key, value in picked.items() if value is not None})


def token_id_capture_enabled_for_agent(global_config_dict: Any, agent_name: str | None) -> bool:
    """Whether an agent instance's model calls are captured: the run's switch and ``all_agents`` or its own flag."""
    settings = token_id_capture_config(global_config_dict).token_id_capture
    if not settings.enabled or settings.all_agents:
        return settings.enabled
    instance = global_config_dict.get(agent_name) if agent_name and isinstance(global_config_dict, Mapping) else None
    agents = instance.get("responses_api_agents") if isinstance(instance, Mapping) else None
    if not isinstance(agents, Mapping):
        return False
    return any(isinstance(agent, Mapping) and bool(agent.get("token_id_capture")) for agent in agents.values())


def token_id_capture_applies(global_config_dict: Any, agent_opted_in: bool) -> bool:
    """Whether an agent's own model calls go under the training-capture path: the run's switch is on, and either
    ``all_agents`` or the agent's own flag says so.

    Read without validating the block: an agent asks on every rollout, and the model server that records the tokens
    has already refused a malformed block at start-up. A run without a global config captures nothing.
    """
    block = global_config_dict.get(TOKEN_ID_CAPTURE_BLOCK) if isinstance(global_config_dict, Mapping) else None
    if not isinstance(block, Mapping) or not block.get("enabled", False):
        return False
    return agent_opted_in or bool(block.get("all_agents", False))
