"""One error tree: every error the framework raises on purpose is a NeMoGymError, and the CLI prints it as one line."""

from __future__ import annotations

import pytest

from nemo_gym import config_types
from nemo_gym.cli import main as cli_main
from nemo_gym.cli import router
from nemo_gym.datasets.render import PromptFieldMissingError, PromptRenderError
from nemo_gym.datasets.storage import DatasetNotFoundError, RegistryError
from nemo_gym.errors import ConfigError, LaunchError, NeMoGymError, TransportError, UserError
from nemo_gym.judge import JudgeError
from nemo_gym.launcher import ServerLaunchError, VenvBuildError
from nemo_gym.launcher.status import HeadServerUnreachable
from nemo_gym.profiling import ProfilerDependencyError
from nemo_gym.rollouts.claim import OutputExistsError, OutputInUseError
from nemo_gym.skills import SkillsError
from nemo_gym.transport.http_client import ServerRequestError, ServerTimeoutError


@pytest.mark.parametrize(
    ("error", "branch"),
    [
        (config_types.ConfigError, UserError),
        (config_types.ConfigPathNotFoundError, ConfigError),
        (config_types.ConfigMissingValuesError, ConfigError),
        (config_types.AlmostServerError, ConfigError),
        (PromptRenderError, ConfigError),
        (PromptFieldMissingError, PromptRenderError),
        (ProfilerDependencyError, UserError),
        (OutputExistsError, ConfigError),
        (OutputInUseError, UserError),
        (SkillsError, ConfigError),
        (VenvBuildError, LaunchError),
        (ServerLaunchError, LaunchError),
        (DatasetNotFoundError, RegistryError),
        (ServerRequestError, TransportError),
        (ServerTimeoutError, TransportError),
        (JudgeError, TransportError),
        (HeadServerUnreachable, NeMoGymError),
    ],
)
def test_every_framework_error_sits_on_its_branch_of_one_tree(error: type[Exception], branch: type[Exception]) -> None:
    assert issubclass(error, branch) and issubclass(error, NeMoGymError)


def test_the_public_faces_export_the_tree_classes_themselves() -> None:
    assert config_types.ConfigError is ConfigError  # NeMo Gym's import path still works, and is the same class
    for branch in (LaunchError, RegistryError, TransportError):
        assert not issubclass(branch, UserError)  # a server that will not start is not the user's typo


@pytest.mark.parametrize(
    "error",
    [
        ServerLaunchError("server 'weather': exited with code 1 during start-up"),
        RegistryError("name 'ds' version 1.0 already exists"),
        ServerTimeoutError("POST http://127.0.0.1:9/run: no answer within 30 s"),
    ],
)
def test_the_cli_prints_any_framework_error_as_one_line(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(argv: list[str]) -> int:
        raise error

    monkeypatch.setattr(router, "_dispatch", fails)
    assert cli_main.main(["env", "status"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: {error}"] and "Traceback" not in err
