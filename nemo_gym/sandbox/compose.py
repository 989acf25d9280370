"""Several containers as one sandbox: the services of a Compose file (NeMo Gym 0.7's ``AsyncSandboxCompose``).

Each service becomes one :class:`AsyncSandbox` on the same provider, and the provider joins them into a group
(:class:`SupportsSandboxGroups`): a private network on which each member is reachable by its service name and
aliases, and the file's named volumes. Services start in dependency order; each one's command runs in the background
of its sandbox, with its output in a log and its exit status recorded, so ``depends_on`` conditions and healthchecks
are checked with ordinary ``exec`` calls. ``start()`` returns once every service with a healthcheck is healthy.

Where it works: the group needs a provider that can give sandboxes a network of their own. ``docker`` can (a
user-defined network and named volumes); ``local`` and ``apptainer`` run on the host's network, where one sandbox
cannot reach another by name, so ``start()`` refuses them with ``NotImplementedError`` before creating anything.

The Compose subset (anything else is refused by name, also before anything is created): top level ``services``,
``volumes`` (plain named volumes), ``networks`` (only ``default``), ``name``; per service ``image`` (prebuilt: no
``build``), ``entrypoint`` and ``command`` (together the process to run: the image's own are replaced by a keep-alive,
so write them into the file), ``environment``, ``working_dir``, ``user``, ``depends_on`` (``service_started``,
``service_healthy``, ``service_completed_successfully``), ``healthcheck``, ``ports`` (container ports only: reach them
through ``services[name].endpoint(port)``), ``expose``, ``networks.default.aliases``, named ``volumes``, ``cpus``,
``mem_limit``, ``labels`` (into the spec's metadata), ``cap_add``, ``shm_size``, ``restart: "no"``, and ``x-sandbox``
(its ``hosts`` and ``resolve_environment`` need nothing here: names resolve on the group's network).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.sandbox.api import AsyncSandbox
from nemo_gym.sandbox.providers import (
    SandboxGroupMember,
    SandboxGroupVolume,
    SandboxProvider,
    SandboxResources,
    SandboxSpec,
    SupportsSandboxGroups,
    create_provider,
)

__all__ = ["AsyncSandboxCompose"]

logger = logging.getLogger(__name__)

_TOP_KEYS = frozenset({"name", "services", "volumes", "networks"})
_SERVICE_KEYS = frozenset({
    "image", "entrypoint", "command", "environment", "working_dir", "user", "depends_on", "healthcheck", "ports",
    "expose", "networks", "volumes", "cpus", "mem_limit", "labels", "cap_add", "shm_size", "restart", "x-sandbox",
})  # fmt: skip
_HEALTH_KEYS = frozenset({"test", "disable", "interval", "timeout", "retries", "start_period", "start_interval"})
_CONDITIONS = frozenset({"service_started", "service_healthy", "service_completed_successfully"})
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?")
_MIB = 1024 * 1024
_CONTROL_TIMEOUT_S = 60.0


def _duration_s(value: object, what: str) -> float:
    """A Compose duration (``1m30s``, ``500ms``, or a number of seconds) in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"{what}: {value!r} is not a Compose duration (e.g. 30s, 1m30s, 500ms)")
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _size_bytes(value: object, what: str) -> int:
    """A Compose size (``512m``, ``1g``, ``1gb``, or bytes) in bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.fullmatch(str(value).strip().lower())
    if match is None:
        raise ValueError(f"{what}: {value!r} is not a size (e.g. 512m, 2g)")
    return int(float(match[1]) * 1024 ** " kmgt".index(match[2] or " "))


def _words(value: object, what: str) -> list[str]:
    """``entrypoint``/``command``/healthcheck ``test``: a string is split as a shell would, a list kept."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [str(item) for item in value]
    raise ValueError(f"{what} must be a string or a list, not {type(value).__name__}")


def _pairs(value: object, what: str) -> dict[str, str]:
    """``environment``/``labels``: a mapping (null values dropped) or a list of ``KEY=VALUE``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(key): str(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        pairs = {}
        for item in value:
            key, equals, text = str(item).partition("=")
            if not equals:
                raise ValueError(f"{what}: {item!r} has no value; write KEY=VALUE (substitutions are not resolved)")
            pairs[key] = text
        return pairs
    raise ValueError(f"{what} must be a mapping or a list of KEY=VALUE")


@dataclass
class _Health:
    command: str
    interval_s: float
    timeout_s: float
    retries: int
    start_period_s: float
    start_interval_s: float


@dataclass
class _Service:
    """One service, checked and ready to create; ``runtime`` is its status directory once launched."""

    name: str
    spec: SandboxSpec
    command: str
    user: str | None
    depends_on: dict[str, str]
    health: _Health | None
    runtime: str = ""
    started_at: float = 0.0
    healthy: bool = False
    member: SandboxGroupMember = field(default_factory=lambda: SandboxGroupMember(aliases=()))


class AsyncSandboxCompose:
    """Start a Compose file's services as sandboxes on one provider, and own their lifecycle.

    ``provider`` is a provider or its config (``{"docker": {...}}``); the collection closes it on ``stop()``.
    ``service_specs`` gives a service's deployment settings (resources, provider options, files, metadata); the
    Compose file's own fields win over the spec's. After ``start()``, ``services[name]`` is that service's running
    :class:`AsyncSandbox`; ``project`` names the group the provider made.
    """

    def __init__(
        self,
        provider: Mapping[str, Any] | SandboxProvider,
        compose_file: str | Path | None,
        *,
        service_specs: Mapping[str, SandboxSpec] | None = None,
        timeout_s: float = 1200,
        poll_interval_s: float = 0.5,
    ) -> None:
        if timeout_s <= 0 or poll_interval_s <= 0:
            raise ValueError("AsyncSandboxCompose: timeout_s and poll_interval_s must be > 0")
        self.provider: SandboxProvider = create_provider(provider) if isinstance(provider, Mapping) else provider
        self.compose_file = Path(compose_file).resolve() if compose_file is not None else None
        self.service_specs = dict(service_specs or {})
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.project = f"compose-{uuid.uuid4().hex}"
        self.services: dict[str, AsyncSandbox] = {}
        self._plans: dict[str, _Service] = {}
        self._group_made = False
        self._started = False
        self._stop_task: asyncio.Task[None] | None = None

    # -- reading the file: every refusal happens here, before anything exists -----------------------------------------

    def _groups(self) -> SupportsSandboxGroups:
        provider = self.provider
        if isinstance(provider, SupportsSandboxGroups):
            return provider
        name = getattr(provider, "name", type(provider).__name__)
        raise NotImplementedError(
            f"Compose needs sandboxes that reach each other by service name on a network of their own; provider "
            f"{name!r} cannot make one (its sandboxes share the host's network): use the docker provider"
        )

    def _plan(self, document: object) -> tuple[list[str], list[str]]:
        """Check the whole file and build each service's spec; the start order and the named volumes."""
        if not isinstance(document, Mapping):
            raise ValueError(f"{self.compose_file}: a Compose file is a mapping")
        unknown = sorted(set(document) - _TOP_KEYS)
        if unknown:
            raise NotImplementedError(f"Compose top-level keys not supported: {unknown}")
        services = document.get("services")
        if not isinstance(services, Mapping) or not services:
            raise ValueError("Compose needs a non-empty 'services' mapping")
        networks = document.get("networks") or {}
        if not isinstance(networks, Mapping) or set(networks) - {"default"}:
            raise NotImplementedError("Compose networks other than 'default' are not supported")
        if set(networks.get("default") or {}) - {"name"}:
            raise NotImplementedError("options of the default Compose network are not supported")
        volumes = document.get("volumes") or {}
        if not isinstance(volumes, Mapping):
            raise ValueError("Compose 'volumes' must be a mapping")
        for volume, declared in volumes.items():
            if not _NAME.fullmatch(str(volume)):
                raise ValueError(f"invalid Compose volume name {volume!r}")
            if set(declared or {}) - {"name"}:
                raise NotImplementedError(f"volume {volume!r}: drivers, options and external volumes are not supported")
        groups = self._groups()
        for name, service in services.items():
            self._plans[name] = self._service(str(name), service, services, set(volumes))
        for plan in self._plans.values():
            for dependency, condition in plan.depends_on.items():
                if condition == "service_healthy" and self._plans[dependency].health is None:
                    raise ValueError(
                        f"service {plan.name!r} waits for {dependency!r} to be healthy, which has no healthcheck"
                    )
            extra = groups.group_member_options(self.project, plan.member)
            plan.spec = replace(plan.spec, provider_options=_merged(plan.spec.provider_options, extra))
        try:
            order = list(TopologicalSorter({p.name: set(p.depends_on) for p in self._plans.values()}).static_order())
        except CycleError as error:
            raise ValueError(f"Compose depends_on has a cycle: {error.args[1]}") from None
        return order, [str(volume) for volume in volumes]

    def _service(self, name: str, service: object, services: Mapping[str, Any], volumes: set[str]) -> _Service:
        where = f"service {name!r}"
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid Compose service name {name!r}")
        if not isinstance(service, Mapping):
            raise ValueError(f"{where} must be a mapping")
        unknown = sorted(set(service) - _SERVICE_KEYS)
        if unknown:
            raise NotImplementedError(f"{where}: Compose keys not supported: {unknown}")
        if str(service.get("restart", "no")) != "no":
            raise NotImplementedError(f"{where}: restart policies are not supported (restart: 'no' only)")
        image = service.get("image")
        if not image:
            raise ValueError(f"{where} needs a prebuilt image")
        argv = _words(service.get("entrypoint"), f"{where} entrypoint") + _words(service.get("command"), where)
        if not argv:
            raise ValueError(f"{where} has neither entrypoint nor command: write the image's own into the file")
        sandbox_options = service.get("x-sandbox") or {}
        if set(sandbox_options) - {"hosts", "resolve_environment"}:
            raise NotImplementedError(f"{where}: x-sandbox supports only hosts and resolve_environment")
        base = self.service_specs.get(name, SandboxSpec())
        resources = SandboxResources.of(base.resources)
        if service.get("cpus") is not None:
            resources = replace(resources, cpu=float(service["cpus"]))
        if service.get("mem_limit") is not None:
            memory = _size_bytes(service["mem_limit"], f"{where} mem_limit")
            resources = replace(resources, memory_mib=max(1, memory // _MIB))
        spec = replace(
            base,
            image=str(image),
            workdir=service.get("working_dir") or base.workdir,
            env={**base.env, **_pairs(service.get("environment"), f"{where} environment")},
            metadata={**base.metadata, **_pairs(service.get("labels"), f"{where} labels")},
            resources=resources,
            ports=_ports(service.get("ports") or [], where) or list(base.ports),
            entrypoint=None,
        )
        member = SandboxGroupMember(
            aliases=(name, *_aliases(service.get("networks"), where)),
            volumes=_mounts(service.get("volumes") or [], volumes, where),
            cap_add=tuple(str(c) for c in service.get("cap_add") or ()),
            shm_size=None if service.get("shm_size") is None else _size_bytes(service["shm_size"], f"{where} shm_size"),
        )
        user = service.get("user")
        return _Service(
            name=name,
            spec=spec,
            command=shlex.join(argv),
            user=None if user is None else str(user),
            depends_on=_dependencies(service.get("depends_on"), services, where),
            health=_health(service.get("healthcheck"), where),
            member=member,
        )

    # -- running ------------------------------------------------------------------------------------------------------

    async def start(self) -> AsyncSandboxCompose:
        """Create the group and every service in dependency order; on any failure, everything made is removed."""
        if self._started:
            raise RuntimeError("this Compose collection was already started: make a new AsyncSandboxCompose")
        if self.compose_file is None:
            raise ValueError("AsyncSandboxCompose.start() needs a Compose file")
        self._started = True
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                await self._start_all()
        except BaseException as error:
            try:
                await self.stop()
            except Exception as cleanup:
                logger.warning("Compose project %s: cleanup after a failed start failed: %s", self.project, cleanup)
            if isinstance(error, TimeoutError) and deadline.expired():
                raise TimeoutError(f"Compose services were not ready within {self.timeout_s:g}s") from error
            raise
        return self

    async def _start_all(self) -> None:
        assert self.compose_file is not None
        document = yaml.safe_load(self.compose_file.read_text(encoding="utf-8"))
        order, volumes = self._plan(document)
        groups = self._groups()
        await groups.create_group(self.project, volumes)
        self._group_made = True
        for name in order:
            plan = self._plans[name]
            for dependency, condition in plan.depends_on.items():
                await self._wait(self._plans[dependency], condition)
            sandbox = AsyncSandbox(self.provider, plan.spec, owns_provider=False)
            await sandbox.start()
            self.services[name] = sandbox
            await self._launch(plan, sandbox)
        for name in order:
            if self._plans[name].health is not None:
                await self._wait(self._plans[name], "service_healthy")

    async def _control(self, sandbox: AsyncSandbox, command: str, what: str, user: str | None = None) -> str:
        """Run one of our own bookkeeping commands; its stdout, or a ``RuntimeError`` saying what failed."""
        result = await sandbox.exec(command, timeout_s=_CONTROL_TIMEOUT_S, user=user)
        if result.return_code != 0:
            raise RuntimeError(
                f"{what} failed ({result.return_code}): {(result.stderr or result.stdout or '').strip()}"
            )
        return result.stdout or ""

    async def _launch(self, plan: _Service, sandbox: AsyncSandbox) -> None:
        """Start the service's process in the background: output to ``log``, exit status to ``exit``."""
        where = f"Compose service {plan.name!r}"
        # a status directory the service's own user can write (mktemp honours the sandbox's TMPDIR)
        made = 'made=$(mktemp -d) && chmod 777 "$made" && printf %s "$made"'
        runtime = (await self._control(sandbox, made, f"{where}: making its status directory")).strip()
        if not runtime:
            raise RuntimeError(f"{where}: mktemp -d printed no directory")
        plan.runtime = shlex.quote(runtime)
        script = f"touch {plan.runtime}/started; {plan.command}; echo $? > {plan.runtime}/exit"
        launch = f"sh -c {shlex.quote(script)} > {plan.runtime}/log 2>&1 < /dev/null &"
        await self._control(sandbox, launch, f"{where}: starting it", user=plan.user)
        while await self._state(plan) == "":
            await asyncio.sleep(self.poll_interval_s)
        plan.started_at = asyncio.get_running_loop().time()

    async def _state(self, plan: _Service) -> str:
        """``exit:<status>`` once the service's process ended, ``started`` while it runs, ``""`` before it runs."""
        runtime = plan.runtime
        probe = f"if test -f {runtime}/exit; then printf exit:; cat {runtime}/exit; elif test -f {runtime}/started; then echo started; fi"
        return (await self._control(self.services[plan.name], probe, f"reading {plan.name!r}'s status")).strip()

    async def _exit_code(self, plan: _Service) -> int | None:
        state = await self._state(plan)
        return int(state.removeprefix("exit:")) if state.startswith("exit:") else None

    async def _log_tail(self, plan: _Service) -> str:
        result = await self.services[plan.name].exec(f"tail -c 2000 {plan.runtime}/log", timeout_s=_CONTROL_TIMEOUT_S)
        return (result.stdout or "").strip()

    async def _wait(self, plan: _Service, condition: str) -> None:
        """Until ``plan`` meets ``condition``; a ``RuntimeError`` when it exits wrongly or stays unhealthy."""
        if condition == "service_started" or plan.healthy:
            return
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            code = await self._exit_code(plan)
            if code is not None:
                if condition == "service_completed_successfully" and code == 0:
                    return
                raise RuntimeError(
                    f"Compose service {plan.name!r} exited with status {code}: {await self._log_tail(plan)}"
                )
            health = plan.health
            if condition == "service_completed_successfully" or health is None:
                await asyncio.sleep(self.poll_interval_s)
                continue
            probe = await self.services[plan.name].exec(health.command, timeout_s=health.timeout_s, user=plan.user)
            if probe.return_code == 0:
                plan.healthy = True
                return
            starting = loop.time() - plan.started_at < health.start_period_s
            if not starting:
                failures += 1
                if failures >= health.retries:
                    detail = (probe.stderr or probe.stdout or "").strip()
                    raise RuntimeError(f"Compose service {plan.name!r} is unhealthy after {failures} checks: {detail}")
            await asyncio.sleep(health.start_interval_s if starting else health.interval_s)

    async def stop(self) -> None:
        """Stop every service (in reverse order), remove the group, close the provider; later calls wait for the first."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop_all())
        await asyncio.shield(self._stop_task)

    async def _stop_all(self) -> None:
        errors: list[Exception] = []
        for name in reversed(list(self.services)):
            try:
                await self.services[name].stop()
            except Exception as error:
                errors.append(error)
        if self._group_made:
            try:
                await self._groups().remove_group(self.project)
            except Exception as error:
                errors.append(error)
        try:
            await self.provider.aclose()
        except Exception as error:
            errors.append(error)
        if errors:
            raise ExceptionGroup(f"stopping Compose project {self.project} failed", errors)

    async def __aenter__(self) -> AsyncSandboxCompose:
        return self if self._started else await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _merged(options: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Provider options with a group's added: lists (run args, volumes) are extended, other values replaced."""
    merged = dict(options)
    for key, value in extra.items():
        if isinstance(value, list) and value:
            before = merged.get(key)
            merged[key] = [*([] if before is None else [before] if isinstance(before, str) else before), *value]
        elif not isinstance(value, list):
            merged[key] = value
    return merged


def _ports(ports: list[Any], where: str) -> list[int]:
    found = []
    for port in ports:
        target = port.get("target") if isinstance(port, Mapping) else port
        published = port.get("published") if isinstance(port, Mapping) else None
        text = str(target)
        protocol = str(port.get("protocol", "tcp")) if isinstance(port, Mapping) else "tcp"
        if "/" in text:
            text, protocol = text.split("/", 1)
        if ":" in text or published not in (None, 0, "0", ""):
            raise NotImplementedError(
                f"{where}: port {port!r} publishes a fixed host port, which a sandbox cannot promise; list the "
                "container port only and reach it through services[name].endpoint(port)"
            )
        if protocol != "tcp":
            raise NotImplementedError(f"{where}: only TCP ports are supported, not {protocol!r}")
        found.append(int(text))
    return found


def _aliases(networks: object, where: str) -> tuple[str, ...]:
    if networks is None:
        return ()
    names = list(networks) if isinstance(networks, (list, Mapping)) else [networks]
    if names != ["default"]:
        raise NotImplementedError(f"{where}: networks other than 'default' are not supported")
    settings = (networks.get("default") if isinstance(networks, Mapping) else None) or {}
    if set(settings) - {"aliases"}:
        raise NotImplementedError(f"{where}: network options other than aliases are not supported")
    aliases = tuple(str(alias) for alias in settings.get("aliases") or ())
    bad = [alias for alias in aliases if not _NAME.fullmatch(alias)]
    if bad:
        raise ValueError(f"{where}: invalid network aliases {bad}")
    return aliases


def _mounts(entries: list[Any], declared: set[str], where: str) -> tuple[SandboxGroupVolume, ...]:
    mounts = []
    for entry in entries:
        if isinstance(entry, Mapping):
            kind, source, target = entry.get("type", "volume"), entry.get("source"), str(entry.get("target", ""))
            read_only = bool(entry.get("read_only", False))
        else:
            pieces = str(entry).split(":")
            kind = "volume"
            source, target = (pieces[0], pieces[1]) if len(pieces) > 1 else (None, pieces[0])
            read_only = len(pieces) > 2 and "ro" in pieces[2].split(",")
        if kind != "volume" or source is None or str(source).startswith(("/", ".", "~")):
            raise NotImplementedError(
                f"{where}: volume {entry!r} is not a named volume; bind mounts and anonymous volumes are not "
                "supported (a sandbox need not run on this machine)"
            )
        if source not in declared:
            raise ValueError(f"{where}: volume {source!r} is not declared under the top-level 'volumes'")
        if not target.startswith("/"):
            raise ValueError(f"{where}: volume target {target!r} must be an absolute path")
        mounts.append(SandboxGroupVolume(name=str(source), target=target, read_only=read_only))
    return tuple(mounts)


def _dependencies(depends_on: object, services: Mapping[str, Any], where: str) -> dict[str, str]:
    if depends_on is None:
        return {}
    if isinstance(depends_on, list):
        wanted = {str(name): "service_started" for name in depends_on}
    elif isinstance(depends_on, Mapping):
        wanted = {}
        for name, options in depends_on.items():
            options = options or {}
            if (
                set(options) - {"condition", "required", "restart"}
                or options.get("restart")
                or options.get("required") is False
            ):
                raise NotImplementedError(f"{where}: depends_on {name!r} supports only a condition")
            wanted[str(name)] = str(options.get("condition", "service_started"))
    else:
        raise ValueError(f"{where}: depends_on must be a list or a mapping")
    for name, condition in wanted.items():
        if name not in services:
            raise ValueError(f"{where} depends on unknown service {name!r}")
        if condition not in _CONDITIONS:
            raise ValueError(f"{where}: depends_on condition {condition!r} is not one of {sorted(_CONDITIONS)}")
    return wanted


def _health(check: object, where: str) -> _Health | None:
    if check is None:
        return None
    if not isinstance(check, Mapping):
        raise ValueError(f"{where}: healthcheck must be a mapping")
    unknown = sorted(set(check) - _HEALTH_KEYS)
    if unknown:
        raise NotImplementedError(f"{where}: healthcheck keys not supported: {unknown}")
    test = check.get("test")
    words = [test] if isinstance(test, str) else _words(test, f"{where} healthcheck test")
    if check.get("disable") or not words or words[0] == "NONE":
        return None
    if isinstance(test, str):
        command = test  # a plain string runs through the shell, as CMD-SHELL does
    elif words[0] == "CMD-SHELL" and len(words) == 2:
        command = words[1]
    elif words[0] == "CMD" and len(words) > 1:
        command = shlex.join(words[1:])
    else:
        raise ValueError(f"{where}: healthcheck test {test!r} must start with CMD, CMD-SHELL or NONE")
    return _Health(
        command=command,
        interval_s=_duration_s(check.get("interval", "30s"), f"{where} healthcheck interval"),
        timeout_s=_duration_s(check.get("timeout", "30s"), f"{where} healthcheck timeout"),
        retries=int(check.get("retries", 3)),
        start_period_s=_duration_s(check.get("start_period", 0), f"{where} healthcheck start_period"),
        start_interval_s=_duration_s(check.get("start_interval", "5s"), f"{where} healthcheck start_interval"),
    )
