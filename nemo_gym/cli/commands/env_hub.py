"""``gym env publish NAME`` and ``gym env fetch REPO_ID``: an environment to and from the Hugging Face Hub.

The Hub settings are the dataset registry's (env.yaml or ``+key=value``): ``hf_token``, ``hf_endpoint``,
``hf_organization`` (what a bare repo name is put under).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_gym.cli.command import Command, Invocation, Positional
from nemo_gym.cli.flags import CONFIG_FLAGS, JSON_FLAG, Flag
from nemo_gym.cli.output import console
from nemo_gym.errors import ConfigError, RegistryError

SEARCH_DIR_FLAG = CONFIG_FLAGS[-1]
REPO_ID_FLAG = Flag(("--repo-id",), "Hub repo (org/name; default: hf_organization/NAME)", metavar="REPO_ID")
REVISION_FLAG = Flag(("--revision",), "branch to commit to or fetch (default: main)", metavar="BRANCH")
PUBLIC_FLAG = Flag(("--public",), "create the repo public (default: private)", switch=True)
CREATE_PR_FLAG = Flag(("--create-pr",), "open a pull request instead of committing", switch=True)
OUTPUT_DIR_FLAG = Flag(
    ("--output-dir",), "search root to fetch into: environments/NAME lands under it (default: .)", metavar="DIR"
)
OVERWRITE_FLAG = Flag(("--overwrite",), "replace files that exist with other contents", switch=True)


def _hub(invocation: Invocation) -> Any:
    """The Hub client settings, composed as every command composes its config (env.yaml, then overrides)."""
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.config.tree import plain_dict
    from nemo_gym.datasets.storage.hf import HfDatasetRegistry

    config = plain_dict(compose(ComposeOptions(overrides=list(invocation.overrides), dummy_model=True)).config)
    return HfDatasetRegistry.from_config(config)


def publish(invocation: Invocation) -> int:
    """Check an environment as NeMo Gym 0.7's ``gym env publish`` does (a manifest without placeholders, then
    ``gym env validate NAME``: data, config and the verifier fixtures on the real servers), then upload its folder,
    manifest included, and the servers and data of its own that it needs."""
    from nemo_gym.authoring.environment_hub import collect_bundle, publication_problems, publish_environment
    from nemo_gym.environment.validation import validate_environments

    bundle = collect_bundle(str(invocation.get("name")))
    name = bundle.name  # the new name, when the one given was renamed
    hub = _hub(invocation)
    if not hub.token:
        raise RegistryError("publishing an environment needs hf_token: set it in env.yaml")
    problems = publication_problems(bundle)
    if not problems:
        (check,) = validate_environments([name], invocation.overrides)
        problems = check.problems + [result.line() for result in check.results if not result.ok]
    if problems:
        raise ConfigError(f"{name} is not published: " + "; ".join(problems))
    repo_id = hub.repo_id(invocation.get("repo_id") or name)
    url = publish_environment(
        bundle,
        hub,
        repo_id,
        revision=invocation.get("revision"),
        private=not invocation.get("public"),
        create_pr=bool(invocation.get("create_pr")),
    )
    if invocation.get("json"):
        print(json.dumps({"repo_id": repo_id, "url": url, **bundle.index()}, indent=2))
        return 0
    console.print(f"Published environment {name} to {repo_id}: {len(bundle.files)} file(s)", markup=False)
    console.print(f"  servers published with it: {', '.join(bundle.servers) or 'none'}", markup=False)
    if bundle.framework_servers:
        console.print(f"  from the framework (not uploaded): {', '.join(bundle.framework_servers)}", markup=False)
    console.print(f"  {url}", markup=False)
    return 0


def fetch(invocation: Invocation) -> int:
    """Download a published environment into a search root, ready for ``gym env start --environment NAME``."""
    from nemo_gym.authoring.environment_hub import fetch_environment

    hub = _hub(invocation)
    repo_id = hub.repo_id(str(invocation.get("repo_id")))
    dest = Path(invocation.get("output_dir") or ".").expanduser()
    fetched = fetch_environment(
        hub, repo_id, dest, revision=invocation.get("revision"), overwrite=bool(invocation.get("overwrite"))
    )
    if invocation.get("json"):
        print(json.dumps({"repo_id": repo_id, "name": fetched.name, "root": str(fetched.root), "files": fetched.files}))
        return 0
    console.print(f"Fetched environment {fetched.name} from {repo_id} into {fetched.root}", markup=False)
    search = "" if fetched.root == Path.cwd().resolve() else f" --search-dir {fetched.root}"
    console.print(f"  run it: gym env start --environment {fetched.name}{search}", markup=False)
    return 0


COMMANDS = (
    Command(
        "env",
        "publish",
        "upload an environment (its folder, manifest, and the servers and data of its own) to the Hugging Face Hub",
        publish,
        (REPO_ID_FLAG, REVISION_FLAG, PUBLIC_FLAG, CREATE_PR_FLAG, JSON_FLAG, SEARCH_DIR_FLAG),
        positionals=(Positional("name", "the environment: environments/NAME/ in a search root"),),
        examples=("example: gym env publish my_env --repo-id my-org/my_env",),
    ),
    Command(
        "env",
        "fetch",
        "download an environment published with `gym env publish` into a search root",
        fetch,
        (REVISION_FLAG, OUTPUT_DIR_FLAG, OVERWRITE_FLAG, JSON_FLAG),
        positionals=(Positional("repo_id", "the Hub repo (org/name, or a name under hf_organization)"),),
        examples=("example: gym env fetch my-org/my_env --output-dir envs",),
    ),
)
