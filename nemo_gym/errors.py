"""One error tree for everything the framework raises on purpose.

``NeMoGymError`` is the root, so a caller (or the CLI) can tell "this framework said no, with a message meant for a
person" from a bug. Each branch says whose move it is:

* :class:`UserError` — what the user gave is wrong (a config key, a data row, a flag, a missing file); fix the input.
  :class:`ConfigError` is its historical name in NeMo Gym and stays the class most code raises.
* :class:`LaunchError` — servers could not be brought up (a venv that does not build, a server that exits).
* :class:`RegistryError` — a dataset registry refused or failed an operation.
* :class:`TransportError` — a call between servers failed (connection, HTTP status, deadline).
* :class:`TrainingError` — training could not go on; :class:`TokenDriftError`, a rollout broke the token-id chain.

The CLI prints any of them as one line and exits 1 (``-v`` adds the traceback); anything else is a bug and keeps its
traceback. The config errors NeMo Gym names (``ConfigPathNotFoundError``, ...) are defined here too; other concrete
classes live with the code that raises them. The public faces re-export them (``nemo_gym.config_types``, ...); this
module imports nothing, so any module can use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlmostServerError",
    "ConfigError",
    "ConfigInterpolationError",
    "ConfigMissingValuesError",
    "ConfigPathNotFoundError",
    "InheritPathNotFoundError",
    "LaunchError",
    "MalformedConfigPathsError",
    "NeMoGymError",
    "NoServerInstancesError",
    "RegistryError",
    "SandboxCreateError",
    "ServerRefNotFoundError",
    "TokenDriftError",
    "TrainingError",
    "TransportError",
    "UnsupportedPairingError",
    "UserError",
]


class NeMoGymError(Exception):
    """Root of every error the framework raises on purpose; its message is written for a person."""


class UserError(NeMoGymError):
    """The user's input is wrong: a config key or value, a data row, a flag, a path."""


class ConfigError(UserError):
    """Base for user-facing configuration errors.

    These are actionable user mistakes (typos, missing files, malformed input), not internal bugs. The CLI prints only
    the message (no traceback unless ``-v``) and exits 1; library callers can still catch them like any exception.
    """


# The config errors NeMo Gym names. Each is also the builtin error its callers historically caught.


class ConfigPathNotFoundError(ConfigError, FileNotFoundError):
    """A config_paths entry could not be found in the cwd or the Gym install location."""


class MalformedConfigPathsError(ConfigError, ValueError):
    """config_paths was not a list of paths (e.g. a scalar string was passed)."""


class NoServerInstancesError(ConfigError, ValueError):
    """A run was requested but the merged config defines no server instances to start."""


class ConfigMissingValuesError(ConfigError, ValueError):
    """One or more required config values are still unset (OmegaConf '???') after merging."""


class ServerRefNotFoundError(ConfigError, ValueError):
    """A server cross-reference points to an instance that is not defined in the merged config."""


class UnsupportedPairingError(ConfigError, ValueError):
    """An agent or policy model is bound to a resources server whose ``allowed_agents`` / ``allowed_model_types``
    leave it out."""


class InheritPathNotFoundError(ConfigError, ValueError):
    """An _inherit_from / swap / copy directive references a config path that does not exist."""


class AlmostServerError(ConfigError, ValueError):
    """One or more server blocks are almost-servers (right shape, failed validation) and error_on_almost_servers is
    set, so the run is aborted."""


class ConfigInterpolationError(ConfigError, ValueError):
    """A ``${...}`` interpolation in the merged config cannot be resolved."""


class LaunchError(NeMoGymError):
    """Servers could not be brought up: a venv build failed, or a server process could not start or exited."""


class SandboxCreateError(LaunchError, RuntimeError):
    """A sandbox provider could not create a sandbox: its runtime is missing, the image failed, or it never got ready.

    Also a ``RuntimeError``, as in NeMo Gym, so code written against NeMo Gym's sandbox API keeps catching it.
    """


class TrainingError(NeMoGymError):
    """Training could not go on (``gym train``, ``nemo_gym.training``): a missing ``train`` extra, a bad rollout."""


class TokenDriftError(TrainingError, ValueError):
    """A rollout's turns break the token-id chain: a turn's prompt ids do not start with the previous turn's prompt and
    generated ids, so a trainer would score tokens the model never saw (the message names the rollout, turn and offset).
    """


class RegistryError(NeMoGymError):
    """A registry refused or could not do what was asked (missing dataset or version, existing target, ...)."""


class TransportError(NeMoGymError):
    """Base of every failure of a call between servers, so callers can catch one type."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the attributes when an error crosses a process boundary (pickled by multiprocessing, Ray, ...).
        return (self.__class__, self.args, self.__dict__)
