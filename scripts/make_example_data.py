"""Regenerate a resources server's committed example artifacts with the real tools a contributor uses.

For each named server (default: every resources server):

1. ``gym dataset collate --mode example_validation`` writes ``data/example_metrics.json``;
2. ``gym eval run`` collects one rollout per example row with the embedded SmolLM2 model and the result becomes
   ``data/example_rollouts.jsonl``.

Usage: ``.venv/bin/python scripts/make_example_data.py [NAME ...]``
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from nemo_gym import PARENT_DIR
from nemo_gym.cli.main import main as gym


def example_agent(config_path: Path) -> str:
    """The agent instance whose datasets include the server's example file."""
    for name, block in (yaml.safe_load(config_path.read_text()) or {}).items():
        agents = block.get("responses_api_agents") if isinstance(block, dict) else None
        for inner in (agents or {}).values():
            if any(d.get("type") == "example" for d in inner.get("datasets") or []):
                return name
    raise SystemExit(f"{config_path}: no agent declares an example dataset")


def refresh(name: str) -> None:
    server = PARENT_DIR / "resources_servers" / name
    config = server / "configs" / f"{name}.yaml"
    with tempfile.TemporaryDirectory() as scratch:
        if gym(["dataset", "collate", "--resources-server", name, "--mode", "example_validation", "-o", scratch]):
            raise SystemExit(f"{name}: collate failed")
        output = Path(scratch) / "rollouts.jsonl"
        code = gym([
            "eval", "run", "--resources-server", name, "--agent", example_agent(config),
            "--input", str(server / "data" / "example.jsonl"), "--output", str(output),
            "--temperature", "0.3", "--max-output-tokens", "256", "+shared_venv=true", "+head_server={port: 0}",
        ])  # fmt: skip
        if code != 0:
            raise SystemExit(f"{name}: rollout collection failed (exit {code})")
        shutil.copyfile(output, server / "data" / "example_rollouts.jsonl")


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.parent.parent.name for p in PARENT_DIR.glob("resources_servers/*/configs/*.yaml"))
    for server_name in names:
        print(f"== {server_name}", flush=True)
        refresh(server_name)
