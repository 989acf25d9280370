"""``AsyncSandboxCompose``: a Compose file's services as sandboxes that start in dependency order and stop together.

The orchestration runs for real on the ``local`` provider, extended with the group protocol a container runtime
provides (``local`` alone cannot network sandboxes, and is refused); the docker provider's part is checked by the
``docker`` commands it would run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.sandbox import AsyncSandboxCompose, SandboxGroupMember, SandboxGroupVolume, SandboxSpec, SandboxStatus
from nemo_gym.sandbox.providers.docker import DockerProvider
from nemo_gym.sandbox.providers.local.provider import LocalProvider
from nemo_gym.sandbox.providers.process import ProcessOutput


class GroupedLocal(LocalProvider):
    """The local provider plus group bookkeeping: members reach each other over the host, not by name."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[Any, ...]] = []

    async def create(self, spec: SandboxSpec) -> Any:
        self.events.append(("create", spec.image))
        return await super().create(spec)

    async def create_group(self, group: str, volumes: Any) -> None:
        self.events.append(("create_group", tuple(volumes)))

    def group_member_options(self, group: str, member: SandboxGroupMember) -> dict[str, Any]:
        return {"group": group, "aliases": list(member.aliases)}

    async def remove_group(self, group: str) -> None:
        self.events.append(("remove_group", group))


def _compose(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "docker-compose.yaml"
    path.write_text(text)
    return path


STACK = """
services:
  init:
    image: init-image
    command: ["sh", "-c", "echo seeded > seeded.txt"]
  db:
    image: db-image
    command: sh -c "sleep 0.2; touch ready; exec sleep 300"
    healthcheck: {test: ["CMD-SHELL", "test -f ready"], interval: 0.1s, start_interval: 0.1s, retries: 100}
  app:
    image: app-image
    command: ["sleep", "300"]
    environment: {DATABASE_URL: "postgres://db:5432/app"}
    networks: {default: {aliases: [web]}}
    depends_on:
      db: {condition: service_healthy}
      init: {condition: service_completed_successfully}
"""


async def test_services_start_in_dependency_order_and_stop_together(tmp_path: Path) -> None:
    provider = GroupedLocal()
    compose = AsyncSandboxCompose(
        provider,
        _compose(tmp_path, STACK),
        service_specs={"app": SandboxSpec(env={"FROM_SPEC": "1", "DATABASE_URL": "overridden"})},
        poll_interval_s=0.05,
        timeout_s=600,
    )
    async with compose:
        assert list(compose.services) == ["init", "db", "app"]
        creates = [event[1] for event in provider.events if event[0] == "create"]
        assert creates == ["init-image", "db-image", "app-image"]  # the app only after db is healthy and init done
        assert (await compose.services["init"].exec("cat seeded.txt")).stdout == "seeded\n"
        env = await compose.services["app"].exec('echo "$FROM_SPEC $DATABASE_URL"')
        assert env.stdout == "1 postgres://db:5432/app\n"  # the Compose file's environment wins over the spec
        options = compose._plans["app"].spec.provider_options
        assert options == {"group": compose.project, "aliases": ["app", "web"]}
    assert provider.events[-1] == ("remove_group", compose.project)
    assert all([await sandbox.status() == SandboxStatus.STOPPED for sandbox in compose.services.values()])


async def test_a_failed_dependency_stops_everything_and_says_why(tmp_path: Path) -> None:
    provider = GroupedLocal()
    stack = """
services:
  migrate: {image: m, command: ["sh", "-c", "echo 'no such table' >&2; exit 3"]}
  app:
    image: a
    command: ["sleep", "300"]
    depends_on: {migrate: {condition: service_completed_successfully}}
"""
    compose = AsyncSandboxCompose(provider, _compose(tmp_path, stack), poll_interval_s=0.05)
    with pytest.raises(RuntimeError, match=r"'migrate' exited with status 3: no such table"):
        await compose.start()
    assert [event[0] for event in provider.events] == ["create_group", "create", "remove_group"]
    assert await compose.services["migrate"].status() == SandboxStatus.STOPPED
    with pytest.raises(RuntimeError, match="already started"):
        await compose.start()


@pytest.mark.parametrize(
    ("service", "error", "message"),
    [
        ("{build: ., command: [x]}", NotImplementedError, r"keys not supported: \['build'\]"),
        ("{image: i, command: [x], network_mode: host}", NotImplementedError, "network_mode"),
        ("{image: i, command: [x], ports: ['8080:80']}", NotImplementedError, "fixed host port"),
        ("{image: i, command: [x], volumes: ['./data:/data']}", NotImplementedError, "bind mounts"),
        ("{image: i, command: [x], restart: always}", NotImplementedError, "restart policies"),
        ("{image: i}", ValueError, "neither entrypoint nor command"),
        ("{image: i, command: [x], depends_on: [ghost]}", ValueError, "unknown service 'ghost'"),
        ("{image: i, command: [x], depends_on: {b: {condition: service_healthy}}}", ValueError, "no healthcheck"),
        (
            "{image: i, command: [x], depends_on: [b]}\n  b: {image: i, command: [x], depends_on: [a]}",
            ValueError,
            "cycle",
        ),
    ],
)
async def test_what_cannot_be_honoured_is_refused_before_anything_is_created(
    tmp_path: Path, service: str, error: type[Exception], message: str
) -> None:
    text = f"services:\n  a: {service}\n" + ("" if "\n  b:" in service else "  b: {image: i, command: [x]}\n")
    provider = GroupedLocal()
    with pytest.raises(error, match=message):
        await AsyncSandboxCompose(provider, _compose(tmp_path, text)).start()
    assert provider.events == []


async def test_a_provider_without_networked_groups_is_refused(tmp_path: Path) -> None:
    compose = AsyncSandboxCompose({"local": {}}, _compose(tmp_path, STACK))
    with pytest.raises(NotImplementedError, match="provider 'local' cannot.*use the docker provider"):
        await compose.start()
    assert compose.services == {}


class RecordingDocker(DockerProvider):
    def __init__(self) -> None:
        super().__init__()
        self.commands: list[tuple[str, ...]] = []

    async def _docker(self, *args: str, timeout_s: float | None = None, stdin: bytes | None = None) -> ProcessOutput:
        self.commands.append(args)
        listed = "compose-x_cache\n" if args[:2] == ("volume", "ls") else ""
        return ProcessOutput(return_code=0, stdout=listed, stderr="", pid=0)


def test_docker_puts_a_group_on_its_own_network_with_its_volumes() -> None:
    docker = RecordingDocker()
    asyncio.run(docker.create_group("compose-x", ["cache"]))
    assert docker.commands[0][:2] == ("network", "create") and docker.commands[0][-1] == "compose-x"
    assert docker.commands[1][:2] == ("volume", "create") and docker.commands[1][-1] == "compose-x_cache"
    member = SandboxGroupMember(
        aliases=("db", "database"),
        volumes=(SandboxGroupVolume("cache", "/var/cache", read_only=True),),
        cap_add=("SYS_PTRACE",),
        shm_size=1 << 30,
    )
    options = docker.group_member_options("compose-x", member)
    spec = SandboxSpec(image="postgres", provider_options=options)
    run = docker._run_args(spec, "nemo-gym-1", "postgres")
    assert run[run.index("--network") + 1] == "compose-x"
    assert [run[i + 1] for i, arg in enumerate(run) if arg == "--network-alias"] == ["db", "database"]
    assert "compose-x_cache:/var/cache:ro" in run and "SYS_PTRACE" in run and str(1 << 30) in run
    asyncio.run(docker.remove_group("compose-x"))
    assert ("volume", "rm", "-f", "compose-x_cache") in docker.commands
    assert docker.commands[-1] == ("network", "rm", "compose-x")
