"""``gym env ...``: commands about the composed config of a set of servers."""

from __future__ import annotations

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import CONFIG_FLAGS, MODEL_FLAGS, RAY_FLAG
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
    """Run every check ``gym eval run`` and ``gym env start`` make before starting anything, through the same
    function (``launcher/preflight.py``), so validate cannot pass a config they refuse; start nothing."""
    from nemo_gym.config import ports
    from nemo_gym.launcher.preflight import compose_to_start

    try:
        composed = compose_to_start(invocation.overrides)
    finally:
        ports.release_all()  # the ports it bound only to show they are free
    console.print(f"Config is valid: {len(composed.instances)} server instance(s).")
    for instance in composed.instances:
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
        "run every check `gym eval run` makes before it starts servers, and start nothing",
        validate,
        CONFIG_FLAGS + MODEL_FLAGS + (RAY_FLAG,),
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
