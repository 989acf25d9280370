"""``gym env ...``: commands about the composed config of a set of servers."""

from __future__ import annotations

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import CONFIG_FLAGS, MODEL_FLAGS
from nemo_gym.cli.output import console, print_warning


def resolve(invocation: Invocation) -> int:
    """Print the merged, resolved config with secrets masked. It is for looking at a config, so a value still to be
    set (``???``, or an interpolation of a key no source sets, e.g. a secret kept in env.yaml) is printed as ``???``
    with one warning line each saying what to set, rather than hiding the whole config behind the first error."""
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.global_config import masked_config_yaml

    composed = compose(ComposeOptions(overrides=list(invocation.overrides), allow_unset=True))
    print(masked_config_yaml(composed.config, composed.secrets), end="")
    for line in composed.unset:
        print_warning(line)
    return 0


def validate(invocation: Invocation) -> int:
    """Compose and validate the config without starting anything (a dummy policy model stands in if none is set)."""
    from nemo_gym.config.servers import find_server_instances
    from nemo_gym.config.tree import plain_dict
    from nemo_gym.global_config import parse_global_config_dict

    config = parse_global_config_dict(invocation.overrides, dummy_model=True)
    instances, _ = find_server_instances(plain_dict(config))
    console.print(f"Config is valid: {len(instances)} server instance(s).")
    for instance in instances:
        console.print(f"  {instance.name:<32} {instance.SERVER_TYPE}/{instance.implementation}")
    return 0


def containers(invocation: Invocation) -> int:
    """Make the container runtime ready for the ``docker`` sandbox provider: podman's settings and the base image
    built from Debian packages. Idempotent: seconds when everything is there."""
    from nemo_gym.sandbox.providers.docker.runtime import base_image_tag, ensure_base_image, find_runtime, image_exists

    runtime = find_runtime()
    settings = f", settings {runtime.env['CONTAINERS_CONF']}" if "CONTAINERS_CONF" in runtime.env else ""
    console.print(f"Container runtime: {runtime.kind} ({runtime.binary}){settings}")
    tag = base_image_tag()
    if not image_exists(runtime, tag):
        console.print(f"Building the base image {tag} from Debian packages (about a minute) ...")
    console.print(f"Base image: {ensure_base_image(runtime)}")
    return 0


COMMANDS = (
    Command(
        "env",
        "resolve",
        "print the merged, resolved config (secrets masked)",
        resolve,
        CONFIG_FLAGS + MODEL_FLAGS,
        examples=("example: gym env resolve --config my.yaml +policy_model_name=gpt-4.1",),
    ),
    Command(
        "env",
        "validate",
        "check that a config composes and validates",
        validate,
        CONFIG_FLAGS + MODEL_FLAGS,
        examples=("example: gym env validate --environment my_env",),
    ),
    Command(
        "env",
        "containers",
        "make the container runtime ready for the docker sandbox provider (settings, base image)",
        containers,
        examples=("example: gym env containers",),
    ),
)
