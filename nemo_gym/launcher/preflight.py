"""Every check a launch makes before it starts anything, in the one function that ``gym env validate``,
``gym env start`` and ``gym eval run`` call (:func:`compose_to_start`), so validate cannot pass a config they refuse.

In order: composition (unset ``???`` and interpolations with a "did you mean", every key and type of every server
block, refs, pairings, and each instance's port, bound now: a port that is taken fails here); then each instance's
implementation directory and entrypoint, replicas only on a Ray cluster, no URL credentials beside an API key; then
the head server's port. Each failure is one :class:`~nemo_gym.errors.ConfigError` line naming the file, line and key
where they are known. The launcher looks implementations up through :func:`find_implementation` as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from nemo_gym.config.compose import ComposedConfig, ComposeOptions
from nemo_gym.config.placement import RAY_ADDRESS_KEY, REPLICAS_KEY
from nemo_gym.config.roots import candidate_paths, search_roots
from nemo_gym.config.server_models import ServerInstanceConfig
from nemo_gym.config.tree import plain_dict
from nemo_gym.config.url_credentials import check_url_credentials
from nemo_gym.config.validation import SourceLocator
from nemo_gym.errors import ConfigError
from nemo_gym.launcher.head_server import bind_head_socket

_NOWHERE = SourceLocator([], None, [])
"""For a config whose sources are unknown (one the launcher was handed): messages name the key path only."""


class Implementation(NamedTuple):
    """Where an instance's code is: its directory, the search root holding it, and its entrypoint file."""

    directory: Path
    root: Path
    entrypoint: Path


def compose_to_start(overrides: Sequence[str]) -> ComposedConfig:
    """Compose the config whose servers are to start, with their ports held, and run every check that can fail
    before one starts. Its ports stay held for the launcher (``ports.release_all()`` gives them back)."""
    from nemo_gym.config.compose import compose  # looked up per call, as the commands do (tests stand in for it)

    composed = compose(ComposeOptions(overrides=list(overrides), reserve_ports=True, require_server_instances=True))
    check_before_start(composed)
    return composed


def check_before_start(composed: ComposedConfig) -> None:
    """The checks after composition: implementations, replicas, URL credentials, the head server's port."""
    config = plain_dict(composed.config)
    locator = composed.sources or _NOWHERE
    on_ray = bool(config.get(RAY_ADDRESS_KEY))
    for instance in composed.instances:
        inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
        find_implementation(instance, inner, locator)
        check_replicas(instance, inner, on_ray, locator)
    check_url_credentials(config, composed.instances, locator)
    if not config.get("dry_run"):  # a dry run starts no head server
        _check_head_port(config)


def find_implementation(
    instance: ServerInstanceConfig, inner: dict[str, Any], locator: SourceLocator = _NOWHERE
) -> Implementation:
    """``<root>/<server_type>/<impl>`` in the first search root that has it, and its entrypoint file."""
    block = [instance.name, instance.SERVER_TYPE, instance.implementation]
    relative = Path(instance.SERVER_TYPE) / instance.implementation
    directory = next((c.resolve() for c in candidate_paths(relative) if c.is_dir()), None)
    if directory is None:
        roots = ", ".join(str(r) for r in search_roots())
        raise ConfigError(
            locator.describe(
                block,
                f"implementation directory {relative} not found in any search root ({roots}). Fix the "
                "implementation name, run from the directory that holds it, or add its root with --search-dir DIR",
            )
        )
    entrypoint = directory / str(inner["entrypoint"])
    if not entrypoint.is_file():
        raise ConfigError(
            locator.describe(
                [*block, "entrypoint"], f"{inner['entrypoint']!r} not found in {directory}: name a file there"
            )
        )
    return Implementation(directory, directory.parent.parent, entrypoint.resolve())


def check_replicas(
    instance: ServerInstanceConfig, inner: dict[str, Any], on_ray: bool, locator: SourceLocator = _NOWHERE
) -> None:
    """More than one replica of an instance needs a Ray cluster to place them on."""
    if int(inner.get(REPLICAS_KEY) or 1) > 1 and not on_ray:
        raise ConfigError(
            locator.describe(
                [instance.name, instance.SERVER_TYPE, instance.implementation, REPLICAS_KEY],
                f"replicas are placed on a Ray cluster; pass --ray-address ADDRESS (config key {RAY_ADDRESS_KEY})",
            )
        )


def _check_head_port(config: dict[str, Any]) -> None:
    """The head server's port can be bound (the launcher binds it again when it starts)."""
    head = config.get("head_server") or {}
    host = str(head.get("host") or config.get("default_host") or "127.0.0.1")
    bind_head_socket(host, int(head.get("port", 11000))).close()
