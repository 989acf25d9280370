"""repo_repair's server with real containers: tools act in the rollout's container, the reward is the task's tests
on a fresh copy with the agent's change, and what the agent does to its container is held by its limits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.sandbox.providers.docker.runtime import ContainerRuntimeError, base_image_tag, find_runtime, image_exists
from nemo_gym.server_utils import ServerClient
from resources_servers.repo_repair.app import RepoRepairResourcesServer, RepoRepairResourcesServerConfig

HERE = Path(__file__).parents[1]
TASK: dict[str, Any] = {
    "task_id": "inline-add",
    "repo": {
        "calc/__init__.py": "",
        "calc/ops.py": "def add(a, b):\n    return a - b\n",
        "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    },
    "test_command": "python3 -m pytest -q -p no:cacheprovider tests",
}
FIXED = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def server() -> RepoRepairResourcesServer:
    try:
        runtime = find_runtime()
    except ContainerRuntimeError:
        pytest.skip("no container runtime: `make test` installs podman (`make containers`)")
    if not image_exists(runtime, base_image_tag()):
        pytest.skip(f"the base image {base_image_tag()} is not built: `make containers` builds it")
    config = RepoRepairResourcesServerConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="",
        name="repo_repair",
        domain="coding",
        sandbox_provider={"docker": {"create": {"pids_limit": 128}}},
        max_containers=2,
        command_timeout_s=20,
        test_timeout_s=30,
    )
    return RepoRepairResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


@pytest.fixture
def http(server: RepoRepairResourcesServer) -> Iterator[TestClient]:
    with TestClient(server.setup_webserver()) as client:
        yield client


def seed(http: TestClient, task: dict[str, Any] = TASK) -> None:
    answer = http.post("/seed_session", json=task)
    assert answer.status_code == 200, answer.text


def tool(http: TestClient, name: str, **arguments: str) -> dict[str, Any]:
    answer = http.post(f"/{name}", json=arguments)
    assert answer.status_code == 200, answer.text
    return answer.json()


def verify(http: TestClient, task: dict[str, Any] = TASK) -> dict[str, Any]:
    response = {"id": "r", "created_at": 0, "model": "m", "output": []}
    answer = http.post("/verify", json=task | {"response": response, "responses_create_params": {"input": []}})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_agent_fixes_the_bug_in_its_container_and_is_rewarded(http: TestClient) -> None:
    seed(http)
    assert tool(http, "read_file", path="calc/ops.py") == {"content": TASK["repo"]["calc/ops.py"]}
    failing = tool(http, "run_command", command="python3 -m pytest -q -p no:cacheprovider tests")
    assert failing["exit_code"] == 1 and "assert -1 == 5" in failing["output"]
    assert tool(http, "write_file", path="calc/ops.py", content=FIXED)["bytes"] == len(FIXED)
    assert tool(http, "run_command", command="python3 -m pytest -q tests")["exit_code"] == 0
    result = verify(http)
    assert (result["reward"], result["tests_passed"], result["changed_files"]) == (1.0, True, ["calc/ops.py"])


def test_no_change_or_an_edited_test_scores_zero(server: RepoRepairResourcesServer, http: TestClient) -> None:
    seed(http)
    assert (verify(http)["reward"], len(server._rollouts)) == (0.0, 0)
    seed(http)
    tool(http, "write_file", path="tests/test_ops.py", content="def test_add():\n    assert True\n")
    tool(http, "write_file", path="conftest.py", content="collect_ignore = ['tests']\n")
    result = verify(http)
    assert (result["reward"], result["changed_files"]) == (0.0, [])


def test_a_gold_patch_from_the_data_applies_and_scores_one(http: TestClient) -> None:
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])
    task = {key: row[key] for key in ("task_id", "repo", "test_command")}
    seed(http, task)
    assert tool(http, "apply_patch", patch=row["wrong_patch"])["exit_code"] == 0
    assert verify(http, task)["reward"] == 0.0
    seed(http, task)
    assert tool(http, "apply_patch", patch=row["gold_patch"])["exit_code"] == 0
    assert verify(http, task)["reward"] == 1.0


def test_bombs_and_network_calls_are_held_and_the_rollout_is_still_scored(http: TestClient) -> None:
    seed(http)
    memory = tool(http, "run_command", command="python3 -c 'x = bytearray(900 * 1024 * 1024)'")
    assert memory["exit_code"] == 137
    tool(http, "run_command", command="f() { f | f & }; f; sleep 1")
    assert tool(http, "run_command", command="echo alive") == {"exit_code": 0, "output": "alive\n"}
    network = tool(
        http, "run_command", command="python3 -c 'import urllib.request as u; u.urlopen(\"http://1.1.1.1\")'"
    )
    assert network["exit_code"] != 0 and "unreachable" in network["output"].lower()
    slow = tool(http, "run_command", command="sleep 120")
    assert slow["exit_code"] == 124 and "timed out after 20s" in slow["output"]
    tool(http, "write_file", path="calc/ops.py", content=FIXED)
    assert verify(http)["reward"] == 1.0


@pytest.mark.parametrize(
    "hostile",
    [
        "x = bytearray(900 * 1024 * 1024)\n",
        "import os\nwhile True:\n    os.fork()\n",
        "import urllib.request\nurllib.request.urlopen('http://1.1.1.1', timeout=5)\n",
    ],
    ids=["memory", "fork", "network"],
)
def test_hostile_code_under_test_is_held_at_verification_and_scored(http: TestClient, hostile: str) -> None:
    seed(http)
    tool(http, "write_file", path="calc/ops.py", content=hostile + FIXED)
    result = verify(http)
    assert (result["reward"], result["patch_applied"], result["tests_passed"]) == (0.0, True, False)


def test_tools_before_a_seed_are_refused(http: TestClient) -> None:
    answer = http.post("/run_command", json={"command": "true"})
    assert answer.status_code == 400 and "seed_session" in answer.text
