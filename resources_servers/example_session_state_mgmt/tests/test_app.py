"""The counter server: per-cookie state from seed to verify, its defaults, and the bound on how much it keeps."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.server_utils import ServerClient
from resources_servers.example_session_state_mgmt.app import (
    CounterStore,
    ExampleSessionStateMgmtResourcesServer,
    ExampleSessionStateMgmtResourcesServerConfig,
)

HERE = Path(__file__).resolve().parent.parent
PARAMS = {"input": [{"role": "user", "content": "add 1 then add 2"}]}


def make_server(**config: object) -> ExampleSessionStateMgmtResourcesServer:
    cfg = ExampleSessionStateMgmtResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="", **config)
    return ExampleSessionStateMgmtResourcesServer(config=cfg, server_client=MagicMock(spec=ServerClient))


def _response(*output: dict) -> dict:
    return {"id": "resp_1", "created_at": 0, "model": "m", "object": "response", "output": list(output),
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip


def _call(name: str, arguments: dict, call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


ANSWER = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "It is 6.", "annotations": []}]}  # fmt: skip
TRAJECTORY = _response(
    _call("increment_counter", {"count": 1}, "c1"),
    {"type": "function_call_output", "call_id": "c1", "output": '{"success":true}'},
    _call("increment_counter", {"count": 2}, "c2"),
    {"type": "function_call_output", "call_id": "c2", "output": '{"success":true}'},
    _call("get_counter_value", {}, "c3"),
    {"type": "function_call_output", "call_id": "c3", "output": '{"count":6}'},
    ANSWER,
)


def _verify(client: TestClient, expected_count: int, response: dict = TRAJECTORY) -> dict:
    answer = client.post(
        "/verify", json={"responses_create_params": PARAMS, "response": response, "expected_count": expected_count}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_two_cookie_sessions_keep_independent_counters():
    app = make_server().setup_webserver()
    first, second = TestClient(app), TestClient(app)
    first.post("/seed_session", json={"initial_count": 3})
    second.post("/seed_session", json={"initial_count": 100})
    first.post("/increment_counter", json={"count": 1})
    second.post("/increment_counter", json={"count": -50})
    first.post("/increment_counter", json={"count": 2})
    assert first.post("/get_counter_value", json={}).json() == {"count": 6}
    assert second.post("/get_counter_value", json={}).json() == {"count": 50}
    assert first.cookies != second.cookies


def test_verify_rewards_the_expected_final_count_and_reports_the_trajectory():
    client = TestClient(make_server().setup_webserver())
    client.post("/seed_session", json={"initial_count": 3, "responses_create_params": PARAMS, "expected_count": 6})
    client.post("/increment_counter", json={"count": 1})
    client.post("/increment_counter", json={"count": 2})
    result = _verify(client, expected_count=6)
    assert result["reward"] == 1.0
    assert result["final_count"] == 6
    assert (result["num_increment_calls"], result["num_get_calls"]) == (2, 1)
    assert result["expected_count"] == 6 and result["response"]["output"][-1]["type"] == "message"


def test_verify_gives_zero_for_a_wrong_count():
    client = TestClient(make_server().setup_webserver())
    client.post("/seed_session", json={"initial_count": 3})
    client.post("/increment_counter", json={"count": 1})
    result = _verify(client, expected_count=6, response=_response(ANSWER))
    assert (result["reward"], result["final_count"]) == (0.0, 4)
    assert (result["num_increment_calls"], result["num_get_calls"]) == (0, 0)


def test_verify_drops_the_session_state():
    server = make_server()
    client = TestClient(server.setup_webserver())
    client.post("/seed_session", json={"initial_count": 6})
    assert len(server.store) == 1
    assert _verify(client, expected_count=6)["reward"] == 1.0
    assert len(server.store) == 0
    again = _verify(client, expected_count=6)  # nothing left to read: a second verify cannot score the rollout
    assert (again["reward"], again["final_count"]) == (0.0, None)
    assert client.post("/get_counter_value").json() == {"count": 0}
    assert client.get("/reverify_mode").json() == "unsupported"


def test_unseeded_session_defaults_to_zero():
    client = TestClient(make_server().setup_webserver())
    assert client.post("/get_counter_value").json() == {"count": 0}
    assert client.post("/increment_counter", json={"count": 4}).json() == {"success": True}
    assert client.post("/get_counter_value", json={}).json() == {"count": 4}
    assert _verify(client, expected_count=4)["reward"] == 1.0


def test_verify_without_any_state_is_zero_even_when_zero_is_expected():
    client = TestClient(make_server().setup_webserver())
    result = _verify(client, expected_count=0)
    assert (result["reward"], result["final_count"]) == (0.0, None)


def test_seed_defaults_and_reseeding():
    client = TestClient(make_server().setup_webserver())
    client.post("/seed_session", json={"responses_create_params": PARAMS})  # a row without initial_count
    assert client.post("/get_counter_value").json() == {"count": 0}
    client.post("/increment_counter", json={"count": 9})
    client.post("/seed_session", json={"initial_count": 2})  # a new rollout on the same cookie starts over
    assert client.post("/get_counter_value").json() == {"count": 2}


def test_bad_tool_arguments_are_rejected():
    client = TestClient(make_server().setup_webserver())
    assert client.post("/increment_counter", json={}).status_code == 422
    assert client.post("/increment_counter", json={"count": "many"}).status_code == 422
    assert client.post("/seed_session", json={"initial_count": "x"}).status_code == 422
    assert client.post("/verify", json={"responses_create_params": PARAMS, "response": TRAJECTORY}).status_code == 422


def test_the_number_of_sessions_is_bounded():
    server = make_server(max_sessions=2)
    app = server.setup_webserver()
    oldest, middle, newest = TestClient(app), TestClient(app), TestClient(app)
    oldest.post("/seed_session", json={"initial_count": 1})
    middle.post("/seed_session", json={"initial_count": 2})
    oldest.post("/get_counter_value")  # reading refreshes: `middle` is now the least recently used
    newest.post("/seed_session", json={"initial_count": 3})
    assert len(server.store) == 2
    assert oldest.post("/get_counter_value").json() == {"count": 1}
    assert middle.post("/get_counter_value").json() == {"count": 0}  # evicted, so back to the default
    assert newest.post("/get_counter_value").json() == {"count": 3}


def test_counter_store():
    store = CounterStore(max_sessions=3)
    for i in range(10):
        store.set(f"s{i}", i)
    assert len(store) == 3 and [store.get(f"s{i}") for i in (6, 7, 8, 9)] == [None, 7, 8, 9]
    store.set("s7", 70)  # updating an existing session never evicts
    assert len(store) == 3 and "s8" in store
    assert store.pop("s7") == 70 and store.pop("s7") is None
    with pytest.raises(ValueError):
        CounterStore(max_sessions=0)
    with pytest.raises(ValueError):
        make_server(max_sessions=0)


def test_default_bound_and_example_data():
    assert make_server().store.max_sessions == 100_000
    rows = [json.loads(line) for line in (HERE / "data" / "example.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        assert isinstance(row["initial_count"], int) and isinstance(row["expected_count"], int)
        assert {tool["name"] for tool in row["responses_create_params"]["tools"]} == {
            "increment_counter",
            "get_counter_value",
        }
