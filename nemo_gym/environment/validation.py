"""``gym env validate NAME``: is a shipped environment whole, and do its verifiers still give the rewards they did?

Two passes. The static one reads, starting nothing: the config composes, its data files exist and their rows parse,
the manifest loads and names the config's own servers and datasets, each resources server has a fixture file
(``tests/verifier_cases.jsonl``, :mod:`nemo_gym.verifier_fixture`'s format). The live one starts every resources
server all the named environments need in ONE launch (through the launcher's own pre-start checks, as ``gym eval
run`` does; agents and models are left unstarted) and sends each fixture's known trajectory to the real server:

* a ``/verify`` case: ``/seed_session`` with the request, then ``/verify`` on the same session;
* an episode case (a gymnasium server: its request carries ``responses``, the model's turns in order): ``/reset``
  with the row, then one ``/step`` per turn until the episode ends; its reward is the sum of the steps' rewards;
* a ``malformed`` case must be refused (an HTTP error), whatever the route.

A reward that differs from the case's ``expected_reward`` is one line naming the case and both rewards.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.environment.manifest import EnvironmentManifest, find_manifest, load_manifest
from nemo_gym.errors import NeMoGymError, TransportError, UserError
from nemo_gym.row_fields import REWARD_TOLERANCE

CASES_FILE = Path("tests") / "verifier_cases.jsonl"
"""Where a resources server keeps its fixture, relative to its folder (NeMo Gym 0.7's place)."""
EPISODE_TURNS_KEY = "responses"
"""In an episode case's request: the model's turns, each a Responses API response, played with ``/step``."""


@dataclass(frozen=True)
class FixtureResult:
    """One case sent to a live server: the reward it gave, or why it gave none."""

    environment: str
    server: str
    case: str
    kind: str
    expected: float | None
    reward: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        if self.kind == "malformed":
            return self.error is not None
        return (
            self.error is None
            and self.reward is not None
            and self.expected is not None
            and math.isclose(self.reward, self.expected, rel_tol=0.0, abs_tol=REWARD_TOLERANCE)
        )

    def line(self) -> str:
        where = f"{self.environment}: fixture {self.case!r} ({self.server})"
        if self.kind == "malformed":
            return f"{where}: expected the server to refuse it, but it answered with reward {self.reward}"
        if self.error is not None:
            return f"{where}: expected reward {self.expected}, the verifier failed: {self.error}"
        return f"{where}: expected reward {self.expected}, the verifier gave {self.reward}"


@dataclass
class EnvironmentCheck:
    """What validating one environment found. ``servers`` maps each resources server instance to its cases file."""

    name: str
    manifest: EnvironmentManifest | None = None
    config_path: Path | None = None
    servers: dict[str, Path] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    results: list[FixtureResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(result.ok for result in self.results)

    def as_json(self) -> dict[str, Any]:
        return {
            "environment": self.name,
            "ok": self.ok,
            "problems": self.problems,
            "notes": self.notes,
            "fixtures": [
                {"server": r.server, "case": r.case, "kind": r.kind, "expected_reward": r.expected,
                 "reward": r.reward, "error": r.error, "ok": r.ok}
                for r in self.results
            ],
        }  # fmt: skip


# --- the static pass -------------------------------------------------------------------------------------------------


def check_statically(name: str, overrides: Sequence[str] = ()) -> EnvironmentCheck:
    """Everything about environment ``name`` that can be known without starting a server."""
    from nemo_gym.assets import resolve_selector
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.config.tree import plain_dict

    check = EnvironmentCheck(name)
    check.config_path = resolve_selector("environment", name)  # an unknown name is the user's error, raised
    try:
        check.manifest = load_manifest(find_manifest(name))
    except UserError as error:
        check.problems.append(str(error))
    try:
        composed = compose(
            ComposeOptions(
                overrides=[f"+config_paths=[{check.config_path}]", *overrides],
                require_server_instances=True,
                allow_unset=True,
            )
        )
    except UserError as error:
        check.problems.append(f"config {check.config_path} does not compose: {error}")
        return check
    config = plain_dict(composed.config)
    kinds: dict[str, str] = {instance.name: instance.SERVER_TYPE for instance in composed.instances}
    datasets = _config_datasets(config, composed.instances)
    check.problems.extend(_data_problems(datasets, check.manifest))
    if check.manifest is not None:
        check.problems.extend(_disagreements(check.manifest, kinds, datasets))
        domain = _server_domain(config, composed.instances, check.manifest.resources_server)
        if domain is not None and domain != check.manifest.domain.value:
            check.problems.append(f"manifest domain {check.manifest.domain.value} differs from the config's {domain}")
    for instance in composed.instances:
        if instance.SERVER_TYPE == "resources_servers":
            _find_fixture(check, instance, config[instance.name][instance.SERVER_TYPE][instance.implementation])
    return check


def _config_datasets(config: dict[str, Any], instances: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The datasets the config's agents declare, by file path."""
    found: dict[str, dict[str, Any]] = {}
    for instance in instances:
        if instance.SERVER_TYPE != "responses_api_agents":
            continue
        for entry in config[instance.name][instance.SERVER_TYPE][instance.implementation].get("datasets") or []:
            if isinstance(entry, dict) and entry.get("jsonl_fpath"):
                found[str(entry["jsonl_fpath"])] = entry
    return found


def _server_domain(config: dict[str, Any], instances: Sequence[Any], name: str | None) -> str | None:
    """The ``domain`` the config gives the manifest's resources server, if any."""
    for instance in instances:
        if instance.name == name and instance.SERVER_TYPE == "resources_servers":
            domain = config[instance.name][instance.SERVER_TYPE][instance.implementation].get("domain")
            return str(domain) if domain is not None else None
    return None


def _data_problems(datasets: dict[str, dict[str, Any]], manifest: EnvironmentManifest | None) -> list[str]:
    """Each data file exists and holds rows; a missing file is fine only when something says how to make it."""
    from nemo_gym.jsonl import iter_jsonl
    from nemo_gym.roots import find_path

    scripts = {d.jsonl_fpath: d.prepare_script for d in manifest.datasets} if manifest is not None else {}
    problems = []
    for fpath, entry in datasets.items():
        path = find_path(fpath)
        if path is None:
            fetchable = any(key.endswith("_identifier") and entry.get(key) for key in entry) or scripts.get(fpath)
            if not fetchable:
                problems.append(f"dataset {entry.get('name')!r}: {fpath} not found, and nothing says how to make it")
            continue
        try:
            rows = 0
            for number, row in iter_jsonl(path):
                if not isinstance(row.get("responses_create_params"), dict):
                    raise UserError(f"{path}:{number}: the row has no responses_create_params object")
                rows += 1
        except UserError as error:
            problems.append(str(error))
            continue
        if rows == 0:
            problems.append(f"dataset {entry.get('name')!r}: {path} holds no rows")
    return problems


def _disagreements(
    manifest: EnvironmentManifest, kinds: dict[str, str], datasets: dict[str, dict[str, Any]]
) -> list[str]:
    """Where the manifest names servers or datasets the config does not have (or has otherwise)."""
    problems = []
    wanted = (
        ("resources_server", manifest.resources_server, ("resources_servers",)),
        ("agent_server", manifest.agent_server, ("responses_api_agents", "environment_servers")),
        ("model_server", manifest.model_server, ("responses_api_models",)),
    )
    for key, instance, server_types in wanted:
        if instance is not None and kinds.get(instance) not in server_types:
            problems.append(f"manifest {key} {instance!r} is not a {' or '.join(server_types)} instance of the config")
    declared = {d.jsonl_fpath: d.type for d in manifest.datasets}
    for fpath, kind in declared.items():
        if fpath not in datasets:
            problems.append(f"manifest dataset {fpath} is not among the config's datasets")
        elif datasets[fpath].get("type") != kind and kind != "benchmark":
            problems.append(f"manifest dataset {fpath} is type {kind}, the config says {datasets[fpath].get('type')}")
    problems.extend(
        f"config dataset {fpath} is missing from the manifest" for fpath in datasets if fpath not in declared
    )
    return problems


def _find_fixture(check: EnvironmentCheck, instance: Any, inner: dict[str, Any]) -> None:
    from nemo_gym.launcher.preflight import find_implementation
    from nemo_gym.verifier_fixture import VerifierFixtureError, load_verifier_fixture

    try:
        cases = find_implementation(instance, inner).directory / CASES_FILE
    except UserError as error:
        check.problems.append(str(error))
        return
    if not cases.is_file():
        check.problems.append(f"resources server {instance.name!r} has no verifier fixtures ({cases})")
        return
    try:
        load_verifier_fixture(cases)
    except VerifierFixtureError as error:
        check.problems.append(str(error))
        return
    check.servers[instance.name] = cases


# --- the live pass ---------------------------------------------------------------------------------------------------


def run_fixtures(checks: Sequence[EnvironmentCheck], overrides: Sequence[str] = ()) -> None:
    """Start the resources servers of every check that has fixtures, in one launch, and score each case."""
    from nemo_gym.config import ports
    from nemo_gym.launcher import running_servers
    from nemo_gym.launcher.preflight import compose_to_start
    from nemo_gym.rollouts.reverify import server_urls

    live = [check for check in checks if check.servers and check.config_path is not None]
    if not live:
        return
    config_paths = ",".join(str(check.config_path) for check in live)
    try:
        composed = compose_to_start([f"+config_paths=[{config_paths}]", *overrides])
    except BaseException:
        ports.release_all()
        raise
    needed = {server for check in live for server in check.servers}
    others = [instance.name for instance in composed.instances if instance.name not in needed]
    try:
        with running_servers(config=composed, external=others) as launcher:
            asyncio.run(_score_all(live, server_urls(launcher.composed)))
    finally:
        ports.release_all()  # those held for the servers left unstarted too


async def _score_all(checks: Sequence[EnvironmentCheck], urls: dict[str, str]) -> None:
    from nemo_gym.transport import http_client
    from nemo_gym.verifier_fixture import load_verifier_fixture

    try:
        for check in checks:
            for server, cases_path in check.servers.items():
                for case in load_verifier_fixture(cases_path):
                    reward, error = await _play(urls[server], server, case.request)
                    expected = case.expected_reward
                    check.results.append(
                        FixtureResult(check.name, server, case.name, case.kind, expected, reward, error)
                    )
    finally:
        await http_client.close_session()


async def _play(url: str, server: str, request: dict[str, Any]) -> tuple[float | None, str | None]:
    """Send one case as an agent would; ``(reward, None)``, or ``(None, why)`` when the server refused or failed."""
    try:
        if EPISODE_TURNS_KEY in request:
            return await _play_episode(url, server, request), None
        cookies = await _call(url, server, "/seed_session", request, {}, missing_ok=True)
        answer = await _post(url, server, "/verify", request, cookies)
        return _reward(answer), None
    except (NeMoGymError, ValueError) as error:
        return None, str(error)


async def _play_episode(url: str, server: str, request: dict[str, Any]) -> float:
    turns = request[EPISODE_TURNS_KEY]
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{EPISODE_TURNS_KEY} must be a non-empty list of model responses")
    row = {key: value for key, value in request.items() if key != EPISODE_TURNS_KEY}
    cookies = await _call(url, server, "/reset", row, {})
    total = 0.0
    for number, response in enumerate(turns, start=1):
        step = await _post(url, server, "/step", {**row, "response": response}, cookies)
        total += _reward(step)
        if step.get("terminated") or step.get("truncated"):
            if number != len(turns):
                raise ValueError(f"the episode ended after turn {number} of {len(turns)}")
            return total
    raise ValueError(f"the episode had not ended after all {len(turns)} turns")


async def _call(
    url: str, server: str, path: str, body: dict[str, Any], cookies: dict[str, str], *, missing_ok: bool = False
) -> dict[str, str]:
    """POST ``body`` and return the session cookies to send next (a 404 is no error with ``missing_ok``)."""
    from nemo_gym.transport import http_client

    answer = await http_client.request(
        "POST", f"{url}{path}", json=body, cookies=cookies, server_name=server, url_path=path, retry=False
    )
    if not (missing_ok and answer.status == 404):
        http_client.raise_for_status(answer, server, path)
    return {**cookies, **http_client.cookies_from(answer)}


async def _post(url: str, server: str, path: str, body: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
    from nemo_gym.transport import http_client

    answer = await http_client.request(
        "POST", f"{url}{path}", json=body, cookies=cookies, server_name=server, url_path=path, retry=False
    )
    http_client.raise_for_status(answer, server, path)
    result = await http_client.response_json(answer)
    if not isinstance(result, dict):
        raise TransportError(f"{server} {path} answered {type(result).__name__}, not an object")
    return result


def _reward(answer: dict[str, Any]) -> float:
    reward = answer.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise ValueError(f"the answer has no numeric reward (reward: {reward!r})")
    return float(reward)


def validate_environments(names: Sequence[str], overrides: Sequence[str] = ()) -> list[EnvironmentCheck]:
    """The static checks of every named environment, then all their fixtures in one launch."""
    checks = [check_statically(name, overrides) for name in dict.fromkeys(names)]
    run_fixtures(checks, overrides)
    return checks
