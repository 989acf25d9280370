"""From a server's ``sandbox_provider`` setting to the one-key provider config that ``create_provider`` takes.

A server names a top-level block (``sandbox_provider: sandbox``), and a provider config file defines that block, so
switching runtimes means switching one ``config_paths`` entry::

    sandbox:                      # e.g. nemo_gym/sandbox/providers/local/configs/local.yaml
      local: {network: false}     # exactly one provider key: its constructor arguments
      default_metadata: {...}     # optional, reserved: defaults for SandboxSpec.metadata

``sandbox_provider`` may also be the block itself, inline (``{local: {...}}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_METADATA_KEY", "resolve_provider_config", "resolve_provider_metadata"]

DEFAULT_METADATA_KEY = "default_metadata"
"""The one key of a sandbox block that is not a provider."""


def _plain(value: Any) -> Any:
    """A plain ``dict`` for any mapping (OmegaConf's ``DictConfig`` resolved), anything else unchanged."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        DictConfig = None  # type: ignore[assignment,misc]
    if DictConfig is not None and isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else value


def _provider_keys(block: Mapping[str, Any]) -> list[str]:
    return [key for key in block if key != DEFAULT_METADATA_KEY]


def _sandbox_blocks(named_configs: Mapping[str, Any] | None) -> list[str]:
    """Top-level names that look like sandbox blocks (a mapping with one provider key), for the error message."""
    names = []
    for name, value in (named_configs or {}).items():
        plain = _plain(value)
        if isinstance(plain, Mapping) and len(_provider_keys(plain)) == 1:
            names.append(str(name))
    return sorted(names)


def _block(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The block ``sandbox_provider`` refers to, as plain data, and a phrase naming where it came from."""
    if isinstance(sandbox_provider, Mapping):
        return _plain(sandbox_provider), "inline sandbox_provider config"
    if not isinstance(sandbox_provider, str):
        raise TypeError(
            f"sandbox_provider must be a name reference (a str) or a one-key mapping {{provider: options}}; "
            f"got a {type(sandbox_provider).__name__}"
        )
    if sandbox_provider == "":
        raise ValueError("sandbox_provider is empty: give it a non-empty string naming a top-level sandbox block")
    found = (named_configs or {}).get(sandbox_provider)
    if found is not None:
        return _plain(found), f"reference {sandbox_provider!r}"
    known = ", ".join(map(repr, _sandbox_blocks(named_configs))) or "(none)"
    raise ValueError(
        f"sandbox_provider {sandbox_provider!r} is not defined in the merged config; add a top-level "
        f"'{sandbox_provider}:' block (see nemo_gym/sandbox/providers/local/configs/local.yaml) to one of "
        f"config_paths. Available sandbox configs: {known}"
    )


def _mapping_block(
    sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any], str]:
    """:func:`_block`, refusing a block that is not a mapping (a YAML scalar or list under the name)."""
    block, source = _block(sandbox_provider, named_configs)
    if isinstance(block, Mapping):
        return block, source
    raise ValueError(f"the sandbox block from {source} must be a mapping {{provider: options}}; it is {block!r}")


def resolve_provider_config(
    sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{provider_name: options}`` for ``create_provider``: the named block (looked up in ``named_configs``,
    usually the global config) or the inline mapping, without ``default_metadata``."""
    block, source = _mapping_block(sandbox_provider, named_configs)
    match _provider_keys(block):
        case [only]:
            return {only: block[only]}
        case keys:
            raise ValueError(
                f"the sandbox block from {source} must have exactly one provider key (besides "
                f"{DEFAULT_METADATA_KEY}); it has {keys!r}"
            )


def resolve_provider_metadata(
    sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The block's ``default_metadata`` (``{}`` when absent): defaults a server merges under its own
    ``SandboxSpec.metadata``, so tags that identify the runtime live with the runtime's config."""
    block, source = _mapping_block(sandbox_provider, named_configs)
    defaults = block.get(DEFAULT_METADATA_KEY)
    if not defaults:
        return {}
    if isinstance(defaults, Mapping):
        return dict(defaults)
    raise ValueError(
        f"'{DEFAULT_METADATA_KEY}' from {source} must be a mapping of tag names to values; it is {defaults!r}"
    )
