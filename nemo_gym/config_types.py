"""NeMo Gym's import path for the typed shapes of a config (a public face: it defines nothing).

The definitions live with what they describe:

* server instances, refs and how a block is recognised: :mod:`nemo_gym.config.server_models`;
* datasets, their rows (``AGENT_REF_KEY``) and ``Domain``: :mod:`nemo_gym.config.datasets`;
* the base of every command's config: :mod:`nemo_gym.config.command_config`;
* the dataset registry commands' configs: :mod:`nemo_gym.datasets.storage.cli_configs`;
* the ``/aggregate_metrics`` wire types: :mod:`nemo_gym.metrics`;
* the config errors: :mod:`nemo_gym.errors`.

Code inside ``nemo_gym`` imports from those modules; this one keeps NeMo Gym's names working.
"""

from __future__ import annotations

from omegaconf import DictConfig as DictConfig  # NeMo Gym's environments import these two from here
from omegaconf import OmegaConf as OmegaConf

from nemo_gym.config.command_config import BaseNeMoGymCLIConfig
from nemo_gym.config.datasets import (
    AGENT_REF_KEY,
    BenchmarkDatasetConfig,
    DatasetConfig,
    DatasetSource,
    DatasetType,
    Domain,
    GitlabDatasetSource,
    HuggingFaceDatasetSource,
    JsonlDatasetGitlabIdentifer,
    JsonlDatasetHuggingFaceIdentifer,
    LicenseType,
)
from nemo_gym.config.server_models import (
    SERVER_TYPES,
    AgentServerRef,
    BaseRunServerConfig,
    BaseRunServerInstanceConfig,
    BaseRunServerTypeConfig,
    BaseServerConfig,
    BaseServerInstanceConfig,
    BaseServerTypeConfig,
    EnvironmentServerInstanceConfig,
    EnvironmentServerRef,
    EnvironmentServerTypeConfig,
    ModelServerRef,
    ResourcesServerInstanceConfig,
    ResourcesServerRef,
    ResourcesServerTypeConfig,
    ResponsesAPIAgentServerInstanceConfig,
    ResponsesAPIAgentServerTypeConfig,
    ResponsesAPIModelServerInstanceConfig,
    ResponsesAPIModelServerTypeConfig,
    ServerInstanceConfig,
    ServerInstanceConfigTypeAdapter,
    ServerRef,
    ServerRefTypeAdapter,
    ServerTypeConfig,
    ServerTypeName,
    is_almost_server,
    is_server_ref,
    maybe_get_server_instance_config,
)
from nemo_gym.datasets.storage.cli_configs import (
    BaseUploadJsonlDatasetHuggingFaceConfig,
    DeleteJsonlDatasetGitlabConfig,
    DownloadJsonlDatasetGitlabConfig,
    DownloadJsonlDatasetHuggingFaceConfig,
    UploadJsonlDatasetGitlabConfig,
    UploadJsonlDatasetHuggingFaceConfig,
    UploadJsonlDatasetHuggingFaceMaybeDeleteConfig,
)
from nemo_gym.errors import (
    AlmostServerError,
    ConfigError,
    ConfigInterpolationError,
    ConfigMissingValuesError,
    ConfigPathNotFoundError,
    InheritPathNotFoundError,
    MalformedConfigPathsError,
    NoServerInstancesError,
    ServerRefNotFoundError,
)
from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest, WANDBConfig
from nemo_gym.observability.correlation import ROLLOUT_PATH_PREFIX, TOKEN_CAPTURE_PATH_SEGMENT

__all__ = [
    "AGENT_REF_KEY",
    "ROLLOUT_PATH_PREFIX",
    "TOKEN_CAPTURE_PATH_SEGMENT",
    "SERVER_TYPES",
    "AgentServerRef",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "AlmostServerError",
    "BaseNeMoGymCLIConfig",
    "BaseRunServerConfig",
    "BaseRunServerInstanceConfig",
    "BaseRunServerTypeConfig",
    "BaseServerConfig",
    "BaseServerInstanceConfig",
    "BaseServerTypeConfig",
    "BaseUploadJsonlDatasetHuggingFaceConfig",
    "BenchmarkDatasetConfig",
    "ConfigError",
    "ConfigInterpolationError",
    "ConfigMissingValuesError",
    "ConfigPathNotFoundError",
    "DatasetConfig",
    "DatasetSource",
    "DatasetType",
    "DeleteJsonlDatasetGitlabConfig",
    "Domain",
    "DownloadJsonlDatasetGitlabConfig",
    "DownloadJsonlDatasetHuggingFaceConfig",
    "EnvironmentServerInstanceConfig",
    "EnvironmentServerRef",
    "EnvironmentServerTypeConfig",
    "GitlabDatasetSource",
    "HuggingFaceDatasetSource",
    "InheritPathNotFoundError",
    "JsonlDatasetGitlabIdentifer",
    "JsonlDatasetHuggingFaceIdentifer",
    "LicenseType",
    "MalformedConfigPathsError",
    "ModelServerRef",
    "NoServerInstancesError",
    "ResourcesServerInstanceConfig",
    "ResourcesServerRef",
    "ResourcesServerTypeConfig",
    "ResponsesAPIAgentServerInstanceConfig",
    "ResponsesAPIAgentServerTypeConfig",
    "ResponsesAPIModelServerInstanceConfig",
    "ResponsesAPIModelServerTypeConfig",
    "ServerInstanceConfig",
    "ServerInstanceConfigTypeAdapter",
    "ServerRef",
    "ServerRefNotFoundError",
    "ServerRefTypeAdapter",
    "ServerTypeConfig",
    "ServerTypeName",
    "UploadJsonlDatasetGitlabConfig",
    "UploadJsonlDatasetHuggingFaceConfig",
    "UploadJsonlDatasetHuggingFaceMaybeDeleteConfig",
    "WANDBConfig",
    "is_almost_server",
    "is_server_ref",
    "maybe_get_server_instance_config",
]
