"""Server instances in a config: their typed models, references between them, and how a block is recognised.

A server instance is written in three nested levels::

    my_instance:                  # instance name, what refs point at
      resources_servers:          # server type: responses_api_models | resources_servers | responses_api_agents
        my_impl:                  # implementation = directory name under resources_servers/
          entrypoint: app.py
          domain: math

``maybe_get_server_instance_config`` turns such a block into a typed ``ServerInstanceConfig``; ``is_almost_server``
spots a block that has the shape but fails validation (reported, not silently ignored); ``is_server_ref`` reads a
``{type, name}`` reference to another instance.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from nemo_gym.checkout import SERVER_FOLDERS
from nemo_gym.config.datasets import BenchmarkDatasetConfig, DatasetConfig, Domain
from nemo_gym.config.tree import plain_dict


class BaseServerConfig(BaseModel):
    host: str
    port: int
    num_workers: int | None = None


class BaseRunServerConfig(BaseServerConfig):
    entrypoint: str
    domain: Domain | None = None


class BaseRunServerInstanceConfig(BaseRunServerConfig):
    name: str


class BaseRunServerTypeConfig(BaseRunServerConfig):
    """The innermost block of a server instance: one implementation's settings. Extra keys are the implementation's."""

    model_config = ConfigDict(extra="allow")

    # Left out here, the launcher fills them in; mypy cannot know that pydantic allows widening a field.
    host: str | None = None  # type: ignore[assignment]
    port: int | None = None  # type: ignore[assignment]
    datasets: list[DatasetConfig | BenchmarkDatasetConfig] | None = None


ServerTypeName = Union[Literal["responses_api_models"], Literal["resources_servers"], Literal["responses_api_agents"]]  # noqa: UP007
SERVER_TYPES: tuple[str, ...] = SERVER_FOLDERS


class BaseServerTypeConfig(BaseModel):
    SERVER_TYPE: ServerTypeName


class ResponsesAPIModelServerTypeConfig(BaseServerTypeConfig):
    model_config = ConfigDict(extra="allow")

    SERVER_TYPE: Literal["responses_api_models"] = "responses_api_models"
    responses_api_models: dict[str, BaseRunServerTypeConfig] = Field(min_length=1, max_length=1)


class ResourcesServerTypeConfig(BaseServerTypeConfig):
    model_config = ConfigDict(extra="allow")

    SERVER_TYPE: Literal["resources_servers"] = "resources_servers"
    resources_servers: dict[str, BaseRunServerTypeConfig] = Field(min_length=1, max_length=1)

    @model_validator(mode="after")
    def _require_domain(self) -> ResourcesServerTypeConfig:
        """A resources server must say what it trains, so catalogs and metrics can group it."""
        for impl, inner in self.resources_servers.items():
            if inner.domain is None:
                allowed = ", ".join(d.value for d in Domain)
                raise ValueError(f"resources server {impl!r} needs a `domain:` (one of: {allowed})")
        return self


class ResponsesAPIAgentServerTypeConfig(BaseServerTypeConfig):
    model_config = ConfigDict(extra="allow")

    SERVER_TYPE: Literal["responses_api_agents"] = "responses_api_agents"
    responses_api_agents: dict[str, BaseRunServerTypeConfig] = Field(min_length=1, max_length=1)


ServerTypeConfig = Union[  # noqa: UP007 (NeMo Gym spells these as Union)
    ResponsesAPIModelServerTypeConfig, ResourcesServerTypeConfig, ResponsesAPIAgentServerTypeConfig
]


class ModelServerRef(BaseModel):
    type: Literal["responses_api_models"]
    name: str


class ResourcesServerRef(BaseModel):
    type: Literal["resources_servers"]
    name: str


class AgentServerRef(BaseModel):
    type: Literal["responses_api_agents"]
    name: str


ServerRef = Union[ModelServerRef, ResourcesServerRef, AgentServerRef]  # noqa: UP007
ServerRefTypeAdapter = TypeAdapter(ServerRef)


class BaseServerInstanceConfig(BaseServerTypeConfig):
    """A named server instance: the type block plus the instance name and the raw config it came from."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    server_type_config_dict: DictConfig = Field(exclude=True)
    datasets: list[DatasetConfig | BenchmarkDatasetConfig] | None = None

    @model_validator(mode="after")
    def _lift_datasets(self) -> BaseServerInstanceConfig:
        if self.datasets is None:
            self.datasets = self.get_inner_run_server_config().datasets
        return self

    @property
    def implementation(self) -> str:
        """The implementation directory name, e.g. ``simple_agent``."""
        return next(iter(getattr(self, self.SERVER_TYPE)))

    def get_inner_run_server_config(self) -> BaseRunServerTypeConfig:
        return getattr(self, self.SERVER_TYPE)[self.implementation]

    def get_inner_run_server_config_dict(self) -> DictConfig:
        return self.server_type_config_dict[self.SERVER_TYPE][self.implementation]

    def get_server_ref(self) -> ServerRef:
        return ServerRefTypeAdapter.validate_python({"type": self.SERVER_TYPE, "name": self.name})


class ResponsesAPIModelServerInstanceConfig(ResponsesAPIModelServerTypeConfig, BaseServerInstanceConfig):
    pass


class ResourcesServerInstanceConfig(ResourcesServerTypeConfig, BaseServerInstanceConfig):
    pass


class ResponsesAPIAgentServerInstanceConfig(ResponsesAPIAgentServerTypeConfig, BaseServerInstanceConfig):
    pass


ServerInstanceConfig = Union[  # noqa: UP007 (NeMo Gym spells these as Union)
    ResponsesAPIModelServerInstanceConfig, ResourcesServerInstanceConfig, ResponsesAPIAgentServerInstanceConfig
]
ServerInstanceConfigTypeAdapter = TypeAdapter(ServerInstanceConfig)


def _server_type_of(server_type_config_dict: Any) -> str | None:
    if not isinstance(server_type_config_dict, (dict, DictConfig)):
        return None
    present = [t for t in SERVER_TYPES if t in server_type_config_dict]
    return present[0] if len(present) == 1 else None


def is_almost_server(server_type_config_dict: Any) -> bool:
    """Detects if a config looks like a server but might fail validation.

    Looks like a server = exactly one server-type key whose value is a mapping with an implementation block that has
    an ``entrypoint``.
    """
    server_type = _server_type_of(server_type_config_dict)
    if server_type is None:
        return False
    implementations = server_type_config_dict[server_type]
    if not isinstance(implementations, (dict, DictConfig)):
        return False
    return any(isinstance(inner, (dict, DictConfig)) and "entrypoint" in inner for inner in implementations.values())


def maybe_get_server_instance_config(
    name: str, server_type_config_dict: Any
) -> tuple[ServerInstanceConfig | None, ValidationError | None]:
    """Returns ServerInstanceConfig if a valid server, otherwise None with error details"""
    server_type = _server_type_of(server_type_config_dict)
    if server_type is None:
        return None, None
    if not isinstance(server_type_config_dict, DictConfig):
        server_type_config_dict = OmegaConf.create(server_type_config_dict)
    data = plain_dict(server_type_config_dict)
    models: dict[str, type[ServerInstanceConfig]] = {
        "responses_api_models": ResponsesAPIModelServerInstanceConfig,
        "resources_servers": ResourcesServerInstanceConfig,
        "responses_api_agents": ResponsesAPIAgentServerInstanceConfig,
    }
    model = models[server_type]
    try:
        instance = model.model_validate({**data, "name": name, "server_type_config_dict": server_type_config_dict})
    except ValidationError as e:
        return None, e
    return instance, None


def is_server_ref(config_dict: Any) -> ServerRef | None:
    """The value as a :data:`ServerRef` if it has exactly the ``{type, name}`` shape of one, else None."""
    if not isinstance(config_dict, (dict, DictConfig)) or set(config_dict.keys()) != {"type", "name"}:
        return None
    try:
        return ServerRefTypeAdapter.validate_python(dict(config_dict))
    except ValidationError:
        return None
