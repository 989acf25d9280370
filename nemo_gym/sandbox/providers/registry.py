"""Provider names to provider classes, so a config can pick a runtime by name: ``{"docker": {...}}``.

A name is looked up in three places, first match wins:

1. classes registered in this process with :func:`register_provider` (tests, plugins loaded by hand);
2. the built-in providers (``local``, ``docker``, ``apptainer``), imported only when asked for;
3. entry points in the ``nemo_gym.sandbox_providers`` group, so an installed package can ship a provider::

       [project.entry-points."nemo_gym.sandbox_providers"]
       my_runtime = "my_pkg.provider:MyRuntimeProvider"

Two installed packages claiming one entry-point name is an error (which one wins would be an accident); an entry point
hidden by a registered or built-in name is logged and ignored.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from nemo_gym.sandbox.providers.base import SandboxProvider

__all__ = ["ENTRY_POINT_GROUP", "create_provider", "get_provider_class", "list_providers", "register_provider"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nemo_gym.sandbox_providers"

ProviderClass = type[SandboxProvider]

_BUILTIN: dict[str, str] = {
    "apptainer": "nemo_gym.sandbox.providers.apptainer:ApptainerProvider",
    "docker": "nemo_gym.sandbox.providers.docker:DockerProvider",
    "local": "nemo_gym.sandbox.providers.local:LocalProvider",
}
"""Built-in names and where their classes live (``module:attribute``), imported on first use."""

_registered: dict[str, ProviderClass] = {}
_entry_point_cache: dict[str, Callable[[], Any]] | None = None


def _import_builtin(target: str) -> ProviderClass:
    module_name, _, attribute = target.partition(":")
    provider_class: ProviderClass = getattr(importlib.import_module(module_name), attribute)
    return provider_class


def _entry_points() -> dict[str, Callable[[], Any]]:
    """Installed providers by name (read once per process)."""
    global _entry_point_cache
    if _entry_point_cache is not None:
        return _entry_point_cache
    claims: dict[str, tuple[str, Callable[[], Any]]] = {}  # name -> (distribution, loader)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(entry, "dist", None), "name", None) or "<unknown distribution>"
        earlier = claims.get(entry.name)
        if earlier is not None:
            raise ValueError(
                f"Duplicate sandbox provider entry point {entry.name!r}: both {earlier[0]!r} and {dist!r} publish "
                "it; uninstall or rename one"
            )
        claims[entry.name] = (dist, entry.load)
        if entry.name in _BUILTIN or entry.name in _registered:
            logger.warning("entry point %r of %r ignored: shadowed by a provider of that name", entry.name, dist)
    _entry_point_cache = {name: loader for name, (_, loader) in claims.items()}
    return _entry_point_cache


def register_provider(name: str, provider_class: ProviderClass, *, override: bool = False) -> None:
    """Make ``provider_class`` available under ``name``; taking a name already in use needs ``override=True``."""
    in_use = name in _registered or name in _BUILTIN
    if not name or (in_use and not override):
        reason = (
            f"{name!r} is already registered; pass override=True to replace it"
            if name
            else "the provider name must be non-empty"
        )
        raise ValueError(f"register_provider(): {reason}")
    _registered[name] = provider_class


def _builtin_class(name: str) -> ProviderClass | None:
    target = _BUILTIN.get(name)
    return None if target is None else _import_builtin(target)


def _installed_class(name: str) -> ProviderClass | None:
    load = _entry_points().get(name)
    return None if load is None else load()


def get_provider_class(name: str) -> ProviderClass:
    """The class behind ``name``: registered first, then built-in, then installed entry points."""
    for lookup in (_registered.get, _builtin_class, _installed_class):
        found = lookup(name)
        if found is not None:
            return found
    raise ValueError(
        f"Unknown sandbox provider {name!r}. Available providers: {', '.join(list_providers())} "
        "(install or register_provider() another)"
    )


def create_provider(config: Mapping[str, Any]) -> SandboxProvider:
    """Build a provider from a one-key config, ``{name: constructor keyword arguments}`` (``None`` means none)."""
    entries = list(config.items())
    if len(entries) != 1:
        raise ValueError(
            f"a sandbox provider config holds exactly one provider name as its key; got keys {list(config)!r}"
        )
    [(name, options)] = entries
    if not name or not isinstance(name, str):
        raise ValueError(f"sandbox provider config key {name!r}: the provider name must be a non-empty string")
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(
            f"sandbox provider {name!r}: its options must be a mapping of keyword arguments, "
            f"got a {type(options).__name__}"
        )
    return get_provider_class(name)(**dict(options or {}))


def list_providers() -> list[str]:
    """Every name :func:`get_provider_class` would accept, sorted."""
    return sorted({*_registered, *_BUILTIN, *_entry_points()})
