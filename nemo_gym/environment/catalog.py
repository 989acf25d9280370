"""The environment catalog ``gym list environments`` shows and filters: each environment with its manifest's facts.

An environment without a ``manifest.yaml`` is still listed, with status ``no-manifest`` and none of a manifest's
facts, so a filter on one of them leaves it out (the command says how many it could not judge). A manifest that does
not load is reported, never fatal: one broken file must not hide the catalog. Status follows NeMo Gym 0.7:
``experimental`` for a manifest marked so, none for a manifest that is not, ``no-manifest`` without one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from nemo_gym.assets import list_benchmarks, list_environments
from nemo_gym.environment.manifest import MANIFEST_FILENAME, ManifestError, load_manifest
from nemo_gym.errors import ConfigError

CatalogStatus = Literal["experimental", "no-manifest"]
CatalogKind = Literal["environment", "benchmark"]
FILTERS = ("kind", "domain", "integration_profile", "modality", "licensing", "status", "lifecycle", "determinism")
"""The facts ``gym list environments`` filters on, each by its flag ``--<name with dashes>``: NeMo Gym 0.7's six
(kind, domain, modality, licensing, status, lifecycle) and the manifest's integration profile and determinism."""

__all__ = ["FILTERS", "CatalogEntry", "catalog_entries", "filter_entries"]


@dataclass(frozen=True)
class CatalogEntry:
    """One environment or benchmark as the catalog shows it; manifest facts are None without a manifest."""

    name: str
    kind: CatalogKind
    config_path: str
    status: CatalogStatus | None
    domain: str | None = None
    description: str | None = None
    manifest_path: str | None = None
    manifest_error: str | None = None
    version: str | None = None
    integration_profile: str | None = None
    modality: str | None = None
    licensing: str | None = None
    lifecycle: str | None = None
    determinism: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def catalog_entries(kind: CatalogKind | None = "environment") -> list[CatalogEntry]:
    """Every environment (or benchmark, or with ``None`` both) in the search roots, with its manifest read."""
    entries: list[CatalogEntry] = []
    if kind in (None, "environment"):
        for env in list_environments():
            entries.append(_with_manifest(env.name, "environment", env.config_path, env.domain, env.description))
    if kind in (None, "benchmark"):
        for bench in list_benchmarks():
            entries.append(_with_manifest(bench.name, "benchmark", bench.config_path, bench.domain, bench.description))
    return sorted(entries, key=lambda entry: (entry.name.casefold(), entry.kind))


def _with_manifest(
    name: str, kind: CatalogKind, config_path: Path, domain: str | None, description: str | None
) -> CatalogEntry:
    manifest_path = config_path.parent / MANIFEST_FILENAME
    if config_path.name != "config.yaml" or not manifest_path.is_file():
        return CatalogEntry(name, kind, str(config_path), "no-manifest", domain, description)
    try:
        manifest = load_manifest(manifest_path)
    except ManifestError as e:
        return CatalogEntry(name, kind, str(config_path), "no-manifest", domain, description, manifest_error=str(e))
    return CatalogEntry(
        name=name,
        kind=manifest.kind,
        config_path=str(config_path),
        status="experimental" if manifest.experimental else None,
        domain=_text(manifest.domain),
        description=manifest.description,
        manifest_path=str(manifest_path),
        version=manifest.version,
        integration_profile=manifest.integration_profile,
        modality=manifest.modality,
        licensing=manifest.licensing,
        lifecycle=manifest.lifecycle,
        determinism=manifest.determinism,
    )


def _text(value: Any) -> str:
    """An enum's value (a manifest's domain), or the text itself."""
    return str(getattr(value, "value", value))


def filter_entries(rows: list[dict[str, Any]], wanted: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rows (:meth:`CatalogEntry.as_dict`, perhaps with more keys) whose facts equal every value in ``wanted``
    (keys from :data:`FILTERS` but ``kind``), and per filter how many rows had no such fact to compare (no manifest,
    or one that does not load), for the caller to say. An unknown key or status is a ConfigError."""
    unknown = sorted(set(wanted) - set(FILTERS) | ({"kind"} & set(wanted)))
    if unknown:
        raise ConfigError(f"unknown catalog filter(s): {', '.join(unknown)}; known: {', '.join(FILTERS[1:])}")
    status = wanted.get("status")
    if status is not None and status not in get_args(CatalogStatus):
        raise ConfigError(f"--status must be one of {', '.join(get_args(CatalogStatus))}, got {status!r}")
    unjudged: dict[str, int] = {}
    for key, value in wanted.items():
        if key not in ("status", "domain"):
            unjudged[key] = sum(row.get(key) is None for row in rows)
        rows = [row for row in rows if row.get(key) is not None and str(row[key]) == value]
    return rows, {key: count for key, count in unjudged.items() if count}
