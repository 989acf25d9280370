"""Server instances in a config: their typed models, references between them, and how a block is recognised.

A server instance is written in three nested levels::

    my_instance:                  # instance name, what refs point at
      resources_servers:          # server type: responses_api_models | resources_servers | responses_api_agents
                                  #   | environment_servers
        my_impl:                  # implementation = directory name under resources_servers/
          entrypoint: app.py
          domain: math

``maybe_get_server_instance_config`` turns such a block into a typed ``ServerInstanceConfig``; ``is_almost_server``
spots a block that has the shape but fails validation (reported, not silently ignored); ``is_server_ref`` reads a
``{type, name}`` reference to another instance; :func:`environment_servers_by_agent` says which environment server
instances front each agent.
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


ServerTypeName = Union[  # noqa: UP007
    Literal["responses_api_models"],
    Literal["resources_servers"],
    Literal["responses_api_agents"],
    Literal["environment_servers"],
]
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


class EnvironmentServerTypeConfig(BaseServerTypeConfig):
    """An environment server (NeMo Gym 0.7): owns one episode end to end, fronting an agent and a resources server."""

    model_config = ConfigDict(extra="allow")

    SERVER_TYPE: Literal["environment_servers"] = "environment_servers"
    environment_servers: dict[str, BaseRunServerTypeConfig] = Field(min_length=1, max_length=1)


ServerTypeConfig = Union[  # noqa: UP007 (NeMo Gym spells these as Union)
    ResponsesAPIModelServerTypeConfig,
    ResourcesServerTypeConfig,
    ResponsesAPIAgentServerTypeConfig,
    EnvironmentServerTypeConfig,
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


class EnvironmentServerRef(BaseModel):
    type: Literal["environment_servers"]
    name: str


ServerRef = Union[ModelServerRef, ResourcesServerRef, AgentServerRef, EnvironmentServerRef]  # noqa: UP007
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
    """A model server as one named instance of the config."""


class ResourcesServerInstanceConfig(ResourcesServerTypeConfig, BaseServerInstanceConfig):
    """A resources server as one named instance of the config."""


class ResponsesAPIAgentServerInstanceConfig(ResponsesAPIAgentServerTypeConfig, BaseServerInstanceConfig):
    """An agent server as one named instance of the config."""


class EnvironmentServerInstanceConfig(EnvironmentServerTypeConfig, BaseServerInstanceConfig):
    """An environment server as one named instance of the config."""


ServerInstanceConfig = Union[  # noqa: UP007 (NeMo Gym spells these as Union)
    ResponsesAPIModelServerInstanceConfig,
    ResourcesServerInstanceConfig,
    ResponsesAPIAgentServerInstanceConfig,
    EnvironmentServerInstanceConfig,
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
        "environment_servers": EnvironmentServerInstanceConfig,
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


AGENT_SERVER_REF_FIELD = "agent_server"
"""The field of an environment server's block that names the agent it fronts (its ``type`` may be left out)."""


def environment_server_agent_names(settings: Any) -> list[str]:
    """The agents one environment server's settings block refers to: its ``agent_server`` (whose ``type`` may be left
    out) and any other field whose value is a ``{type: responses_api_agents, name}`` ref (a server fronting a user and
    an assistant agent names both)."""
    if isinstance(settings, DictConfig):
        settings = plain_dict(settings)
    if not isinstance(settings, dict):
        return []
    names: list[str] = []
    for field_name, value in settings.items():
        ref = plain_dict(value) if isinstance(value, DictConfig) else value
        if not isinstance(ref, dict) or ref.get("name") is None:
            continue
        if ref.get("type") == "responses_api_agents" or (
            field_name == AGENT_SERVER_REF_FIELD and ref.get("type") is None
        ):
            names.append(str(ref["name"]))
    return names


def environment_servers_by_agent(global_config: Any) -> dict[str, list[str]]:
    """Each agent instance name -> the environment server instances that front it, in config order.

    ``global_config``: a composed config (a ``DictConfig`` or a plain dict). An environment server fronts the agents
    its block refers to (:func:`environment_server_agent_names`); an agent no environment server names is absent.
    """
    by_agent: dict[str, list[str]] = {}
    if isinstance(global_config, DictConfig):
        global_config = plain_dict(global_config)
    if not isinstance(global_config, dict):
        return by_agent
    for instance_name, block in global_config.items():
        if not isinstance(block, dict):
            continue
        implementations = block.get("environment_servers")
        if not isinstance(implementations, dict):
            continue
        for settings in implementations.values():
            for agent in environment_server_agent_names(settings):
                servers = by_agent.setdefault(agent, [])
                if str(instance_name) not in servers:
                    servers.append(str(instance_name))
    return by_agent
