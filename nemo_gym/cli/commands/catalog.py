"""``gym list ...`` and ``gym search``: what environments, benchmarks and server implementations are available."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from rich.table import Table

from nemo_gym.assets import (
    ComponentConfig,
    list_benchmarks,
    list_component_configs,
    read_raw_yaml,
)
from nemo_gym.cli.command import Command, Invocation, Positional
from nemo_gym.cli.flags import CONFIG_FLAGS, JSON_FLAG, Flag
from nemo_gym.cli.output import console, print_warning
from nemo_gym.config.keys import MISSING
from nemo_gym.errors import ConfigError

SEARCH_DIR_FLAG = CONFIG_FLAGS[-1]
KINDS = ("environments", "benchmarks", "resources-servers", "models", "agents", "environment-servers")


def _datasets(raw: dict[str, Any]) -> list[str]:
    names = []
    for value in raw.values():
        agents = value.get("responses_api_agents") if isinstance(value, dict) else None
        for inner in (agents or {}).values():
            for dataset in (inner or {}).get("datasets") or []:
                if isinstance(dataset, dict):
                    names.append(f"{dataset.get('name')} ({dataset.get('type')})")
    return names


def _instances(raw: dict[str, Any], server_type: str) -> list[str]:
    found: list[str] = []
    for instance, value in raw.items():
        if isinstance(value, dict) and isinstance(value.get(server_type), dict):
            found.extend(f"{instance} ({impl})" for impl in value[server_type])
    return found


def environment_rows() -> list[dict[str, Any]]:
    """Every environment with its manifest's facts (``environment/catalog.py``) and what its config wires."""
    from nemo_gym.environment.catalog import catalog_entries

    rows = []
    for entry in catalog_entries("environment"):
        raw = read_raw_yaml(Path(entry.config_path))
        rows.append(
            {
                **entry.as_dict(),
                "resources_servers": _instances(raw, "resources_servers"),
                "agents": _instances(raw, "responses_api_agents"),
                "environment_servers": _instances(raw, "environment_servers"),
                "datasets": _datasets(raw),
                "usage": f"gym env start --environment {entry.name}",
            }
        )
    return rows


def benchmark_rows() -> list[dict[str, Any]]:
    rows = []
    for entry in list_benchmarks():
        dataset = entry.dataset
        rows.append(
            {
                "name": entry.name,
                "kind": "benchmark",
                "domain": entry.domain,
                "description": entry.description,
                "agent": entry.agent,
                "num_repeats": dataset.get("num_repeats", 1),
                "dataset": dataset.get("name"),
                "jsonl_fpath": dataset.get("jsonl_fpath"),
                "prepare_script": dataset.get("prepare_script"),
                "prompt_config": dataset.get("prompt_config"),
                "config_path": str(entry.config_path),
                "usage": f"gym eval prepare --benchmark {entry.name} && gym eval run --benchmark {entry.name} "
                f"--split benchmark --output results/{entry.name}.jsonl",
            }
        )
    return rows


def _component_row(component: ComponentConfig, kind: str) -> dict[str, Any]:
    row: dict[str, Any] = {"name": component.name, "kind": kind, "config_path": str(component.config_path)}
    if kind == "resources-server":
        row |= {
            "domain": component.metadata("domain"),
            "description": component.metadata("description"),
            "agents": _instances(component.raw, "responses_api_agents"),
            "environment_servers": _instances(component.raw, "environment_servers"),
            "datasets": _datasets(component.raw),
            "usage": f"gym env start --resources-server {component.name}",
        }
    elif kind == "model":
        row |= {"description": component.metadata("description"), "usage": f"--model-type {component.name}"}
    return row


def resources_server_rows() -> list[dict[str, Any]]:
    return [
        _component_row(c, "resources-server")
        for c in list_component_configs("resources_servers")
        if c.inner_blocks("resources_servers")
    ]


def model_rows() -> list[dict[str, Any]]:
    return [_component_row(c, "model") for c in list_component_configs("responses_api_models")]


def agent_rows() -> list[dict[str, Any]]:
    by_impl: dict[str, dict[str, Any]] = {}
    for component in list_component_configs("responses_api_agents"):
        row = by_impl.setdefault(
            component.implementation,
            {"name": component.implementation, "kind": "agent", "variants": [], "composable": False,
             "config_path": str(component.config_path.parent)},
        )  # fmt: skip
        row["variants"].append(component.flavor)
        for _, _, inner in component.inner_blocks():
            if "resources_server" in inner:
                row["composable"] = True
    for row in by_impl.values():
        row["description"] = (
            "composable (A): wired to a resources server" if row["composable"] else ("self-contained (B)")
        )
    return list(by_impl.values())


def _refs(inner: dict[str, Any], server_type: str) -> list[str]:
    """The names of the ``{type: server_type, name}`` refs of one settings block (``???``: left to the user)."""
    return [
        str(value.get("name"))
        for value in inner.values()
        if isinstance(value, dict) and value.get("type") == server_type and value.get("name") is not None
    ]


def environment_server_rows() -> list[dict[str, Any]]:
    """One row per config of an environment server implementation (``environment_servers/<impl>/configs/``)."""
    from nemo_gym.config.server_models import environment_server_agent_names  # not on every `gym` call's path

    rows = []
    for component in list_component_configs("environment_servers"):
        blocks = component.inner_blocks()
        if not blocks:
            continue
        agents = [name for _, _, inner in blocks for name in environment_server_agent_names(inner) if name != MISSING]
        resources = [name for _, _, inner in blocks for name in _refs(inner, "resources_servers") if name != MISSING]
        rows.append(
            {
                "name": component.name,
                "kind": "environment-server",
                "description": component.metadata("description"),
                "instances": _instances(component.raw, "environment_servers"),
                "agents": agents,
                "resources_servers": resources,
                "needs": [field for _, _, inner in blocks for field, value in inner.items() if _unset_ref(value)],
                "config_path": str(component.config_path),
                "usage": f"gym env start --environment-server {component.name} --config <your wiring.yaml>",
            }
        )
    return rows


def _unset_ref(value: Any) -> bool:
    return isinstance(value, dict) and value.get("name") == MISSING


ROW_SOURCES = {
    "environments": environment_rows,
    "benchmarks": benchmark_rows,
    "resources-servers": resources_server_rows,
    "models": model_rows,
    "agents": agent_rows,
    "environment-servers": environment_server_rows,
}
COLUMNS = {
    "environments": ("name", "status", "lifecycle", "domain", "description"),
    "benchmarks": ("name", "domain", "agent", "num_repeats", "jsonl_fpath", "description"),
    "resources-servers": ("name", "domain", "description"),
    "models": ("name", "description", "config_path"),
    "agents": ("name", "variants", "description"),
    "environment-servers": ("name", "needs", "description", "config_path"),
}


def _render(rows: list[dict[str, Any]], columns: tuple[str, ...], title: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"No {title} found.")
        return
    table = Table(title=f"{title} ({len(rows)})", title_justify="left")
    for column in columns:
        table.add_column(column.replace("_", " ").title(), overflow="fold")
    for row in rows:
        table.add_row(*[_cell(row.get(column)) for column in columns])
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _inspect(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row, indent=2))
        return
    console.print(f"[bold]{row['name']}[/bold] ({row['kind']})")
    for key, value in row.items():
        if key not in ("name", "kind"):
            console.print(f"  {key.replace('_', ' ') + ':':<20} {_cell(value)}")


CATALOG_FLAGS = tuple(
    Flag((f"--{name.replace('_', '-')}",), help_text, metavar=name.upper())
    for name, help_text in (
        ("kind", "environment (default) or benchmark"),
        ("domain", "only this domain (math, coding, agent, ...)"),
        ("integration_profile", "only this manifest profile (custom-gym-verifier, custom-gym-agent-loop, ...)"),
        ("modality", "only this modality (text, multimodal, ...)"),
        ("licensing", "only this licence (an SPDX expression, internal, proprietary or unknown)"),
        ("status", "experimental or no-manifest (NeMo Gym 0.7's catalog status)"),
        ("lifecycle", "active or deprecated"),
        ("determinism", "seeded, stochastic or unknown"),
    )
)
"""``gym list environments``' filters: NeMo Gym 0.7's six, and the manifest's profile and determinism."""


def catalog_rows(invocation: Invocation) -> list[dict[str, Any]]:
    """``gym list environments``' rows: environments, or with ``--kind benchmark`` benchmarks, filtered by the
    catalog flags; a manifest that does not load and a filter some rows cannot be judged by are told as warnings."""
    from nemo_gym.environment.catalog import FILTERS, catalog_entries, filter_entries

    wanted = {key: str(invocation.get(key)) for key in FILTERS if invocation.get(key) is not None}
    kind = wanted.pop("kind", "environment")
    if kind not in ("environment", "benchmark"):
        raise ConfigError(f"--kind must be environment or benchmark, got {kind!r}")
    rows = environment_rows() if kind == "environment" else [e.as_dict() for e in catalog_entries("benchmark")]
    for row in rows:
        if row.get("manifest_error"):
            print_warning(row["manifest_error"])
    rows, unjudged = filter_entries(rows, wanted)
    for key, count in unjudged.items():
        entries = "entry has" if count == 1 else "entries have"
        print_warning(f"{count} catalog {entries} no {key} (no manifest) and could not be matched")
    return rows


def _renamed(name: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of the environment ``name`` was renamed to (its tombstone, told in one notice line), if any."""
    from nemo_gym.assets import resolve_selector

    try:
        current = resolve_selector("environment", name).parent.name
    except ConfigError:
        return None
    return next((row for row in rows if row["name"] == current), None)


def list_command(kind: str):
    def handler(invocation: Invocation) -> int:
        rows = catalog_rows(invocation) if kind == "environments" else ROW_SOURCES[kind]()
        label = "benchmarks" if kind == "environments" and invocation.get("kind") == "benchmark" else kind
        name = invocation.get("name")
        if name:
            match = next((row for row in rows if row["name"] == name), None)
            if match is None and kind == "environments":
                match = _renamed(name, rows)
            if match is None:
                close = difflib.get_close_matches(name, [row["name"] for row in rows], n=3, cutoff=0.5)
                hint = f" Did you mean: {', '.join(close)}?" if close else f" See `gym list {kind}`."
                raise ConfigError(f"no {label.rstrip('s').replace('-', ' ')} named {name!r}.{hint}")
            _inspect(match, invocation.get("json"))
        else:
            _render(rows, COLUMNS[kind], label.replace("-", " ").capitalize(), invocation.get("json"))
        return 0

    return handler


def _tokens(text: str) -> list[str]:
    return [t for t in re.split(r"[\s_\-/]+", text.lower()) if t]


def matches(query: str, *fields: str | None) -> bool:
    """Substring match, or a close fuzzy match (ratio >= 0.7) against a whole field or one of its words."""
    query = query.lower().strip()
    for field in fields:
        if not field:
            continue
        text = field.lower()
        if query in text:
            return True
        for candidate in [text, *_tokens(text)]:
            if difflib.SequenceMatcher(None, query, candidate).ratio() >= 0.7:
                return True
    return False


def search(invocation: Invocation) -> int:
    words = invocation.get("words")
    if len(words) > 2 or (len(words) == 2 and words[0] not in KINDS):
        raise ConfigError(f"usage: gym search [{'|'.join(KINDS)}] QUERY (quote a query with spaces)")
    kinds = [words[0]] if len(words) == 2 else list(KINDS)
    query = words[-1]
    rows = [
        row
        for kind in kinds
        for row in ROW_SOURCES[kind]()
        if matches(query, row.get("name"), row.get("description"), row.get("domain"))
    ]
    _render(rows, ("name", "kind", "domain", "description"), f"Matches for {query!r}", invocation.get("json"))
    return 0


COMMANDS = tuple(
    Command(
        "list", kind, f"list available {kind.replace('-', ' ')} (or inspect one by NAME)", list_command(kind),
        flags=(JSON_FLAG, SEARCH_DIR_FLAG, *(CATALOG_FLAGS if kind == "environments" else ())), positionals=(Positional("name", "inspect this one", nargs="?"),),
    )
    for kind in KINDS
) + (
    Command(
        None, "search", "fuzzy-search environments, benchmarks and servers by name, description or domain", search,
        flags=(JSON_FLAG, SEARCH_DIR_FLAG),
        positionals=(Positional("words", "[TYPE] QUERY, TYPE one of " + ", ".join(KINDS), nargs="+"),),
    ),
)  # fmt: skip
