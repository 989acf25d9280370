"""Legacy ``ng_*`` / ``nemo_gym_*`` entry points, each re-entering the ``gym`` router with a deprecation notice.

``ng_dump_config +config_paths=[a.yaml]`` runs ``gym env resolve +config_paths=[a.yaml]``: Hydra-style overrides keep
working unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys

from nemo_gym import INSTALL_DIR
from nemo_gym.cli.output import print_error, print_warning

LEGACY_COMMANDS: dict[str, list[str]] = {
    "run": ["env", "start"],
    "test": ["env", "test"],
    "test_all": ["env", "test"],
    "dev_test": ["dev", "test"],
    "init_resources_server": ["env", "init"],
    "list_benchmarks": ["list", "benchmarks"],
    "prepare_benchmark": ["eval", "prepare"],
    "collect_rollouts": ["eval", "run", "--no-serve"],
    "e2e_collect_rollouts": ["eval", "run"],
    "aggregate_rollouts": ["eval", "aggregate"],
    "materialize_prompts": ["dataset", "render"],
    "reward_profile": ["eval", "profile"],
    "upload_dataset_to_gitlab": ["dataset", "upload", "--storage", "gitlab"],
    "download_dataset_from_gitlab": ["dataset", "download", "--storage", "gitlab"],
    "prepare_data": ["dataset", "collate"],
    "upload_dataset_to_hf": ["dataset", "upload"],
    "download_dataset_from_hf": ["dataset", "download"],
    "gitlab_to_hf_dataset": ["dataset", "migrate"],
    "delete_dataset_from_gitlab": ["dataset", "rm"],
    "dump_config": ["env", "resolve"],
    "validate": ["env", "validate"],
    "help": ["--help"],
    "version": ["--version"],
    "status": ["env", "status"],
    "pip_list": ["env", "packages"],
    "viewer": ["view"],
}
PREFIXES = ("ng_", "nemo_gym_")


def legacy_name(argv0: str) -> str | None:
    base = os.path.basename(argv0)
    for prefix in PREFIXES:
        if base.startswith(prefix):
            return base[len(prefix) :]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    name = legacy_name(argv[0])
    if name == "reinstall":
        print_warning(f"{os.path.basename(argv[0])} is deprecated; it reinstalls the project with `uv pip install`")
        return subprocess.call(["uv", "pip", "install", "--python", sys.executable, "-e", f"{INSTALL_DIR}[dev]"])
    if name is None or name not in LEGACY_COMMANDS:
        print_error(f"{os.path.basename(argv[0])!r} is not a known legacy command; run `gym --help`")
        return 1
    gym_tokens = LEGACY_COMMANDS[name]
    print_warning(f"{os.path.basename(argv[0])} is deprecated; use `gym {' '.join(gym_tokens)}`")
    from nemo_gym.cli.main import main as gym_main

    return gym_main([*gym_tokens, *argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
