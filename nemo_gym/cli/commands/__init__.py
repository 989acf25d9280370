"""Every ``gym`` command, grouped as on the command line. A command appears here only once it works."""

from nemo_gym.cli.command import Command
from nemo_gym.cli.commands import (
    authoring,
    catalog,
    dataset,
    dataset_registry,
    env,
    env_hub,
    eval,
    health,
    launch,
    loadtest,
    train,
    view,
)

GROUP_HELP = {
    "dataset": "validate, collate, render and export datasets (SFT/DPO); upload and download them (hf, gitlab, local)",
    "dev": "contributor tools",
    "env": "compose, check and run the servers of an environment",
    "eval": "collect scored rollouts and compute their metrics",
    "list": "list environments, resources servers, models and agents",
    "train": "train a model on an environment (GRPO on CPU)",
}

ALL_COMMANDS: tuple[Command, ...] = (
    *env.COMMANDS,
    *env_hub.COMMANDS,
    *loadtest.COMMANDS,
    *launch.COMMANDS,
    *authoring.COMMANDS,
    *eval.COMMANDS,
    *health.COMMANDS,
    *catalog.COMMANDS,
    *dataset.COMMANDS,
    *dataset_registry.COMMANDS,
    *view.COMMANDS,
    *train.COMMANDS,
)
