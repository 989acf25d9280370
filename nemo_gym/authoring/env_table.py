"""The environment table of the README, generated from the resources servers themselves.

One row per resources server: its name, domain and description (config), the tools its example rows offer
(``data/example.jsonl``), its reward rule (the ``**Reward**`` line of its README) and the licences of its datasets
(config). ``gym dev env-table`` rewrites the table between the markers; ``--check`` fails when it is stale, which the
test suite runs, so the README cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from nemo_gym.assets import list_component_configs

START = "<!-- environments-table:start -->"
END = "<!-- environments-table:end -->"
_REWARD_LINE = re.compile(r"\*\*Reward\*\*:?\s*(.+)")


def _tools(server_dir: Path) -> list[str]:
    names: list[str] = []
    example = server_dir / "data" / "example.jsonl"
    if not example.is_file():
        return names
    for line in example.read_bytes().splitlines():
        if not line.strip():
            continue
        for tool in (orjson.loads(line).get("responses_create_params") or {}).get("tools") or []:
            name = tool.get("name") or (tool.get("function") or {}).get("name")
            if name and name not in names:
                names.append(name)
    return names


def _reward(server_dir: Path) -> str:
    """The README's ``**Reward**:`` bullet, with its wrapped continuation lines."""
    readme = server_dir / "README.md"
    if not readme.is_file():
        return "-"
    lines = readme.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        match = _REWARD_LINE.search(line)
        if match:
            parts = [match.group(1).strip()]
            for following in lines[index + 1 :]:
                if not following.startswith("  ") or not following.strip():
                    break
                parts.append(following.strip())
            return " ".join(parts)
    return "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def environment_rows() -> list[list[str]]:
    rows = []
    for component in list_component_configs("resources_servers"):
        if component.flavor != component.implementation or not component.inner_blocks("resources_servers"):
            continue
        licences = sorted(
            {
                str(dataset.get("license"))
                for _, _, inner in component.inner_blocks("responses_api_agents")
                for dataset in inner.get("datasets") or []
                if isinstance(dataset, dict) and dataset.get("license")
            }
        )
        server_dir = component.config_path.parent.parent
        tools = _tools(server_dir)
        rows.append(
            [
                f"`{component.name}`",
                component.metadata("domain") or "-",
                component.metadata("description") or "-",
                ", ".join(f"`{t}`" for t in tools) or "-",
                _reward(server_dir),
                ", ".join(licences) or "-",
            ]
        )
    return rows


def render_table() -> str:
    header = ["Environment", "Domain", "Description", "Tools", "Reward", "Data licence"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in environment_rows()]
    return "\n".join(lines)


def update_readme(readme: Path, check: bool = False) -> bool:
    """Rewrite the table in ``readme``; with ``check`` only report whether it is current. True if current."""
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise ValueError(f"{readme} has no {START} … {END} markers")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    updated = f"{before}{START}\n{render_table()}\n{END}{after}"
    if updated == text:
        return True
    if not check:
        readme.write_text(updated, encoding="utf-8")
    return False
