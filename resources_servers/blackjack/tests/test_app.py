"""Blackjack: hand arithmetic, the transitions of hit and stand, action parsing, seeding and per-session isolation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.base_gymnasium_server import StepRequest
from nemo_gym.server_utils import ServerClient
from resources_servers.blackjack import generate_data
from resources_servers.blackjack.app import (
    ACTION_TOOL,
    BlackjackResourcesServer,
    BlackjackResourcesServerConfig,
    Hand,
    deal,
    hand_value,
    is_natural,
)

DATA = Path(__file__).parents[1] / "data" / "example.jsonl"
ROW = generate_data.build_row(3)


def make_server(**config: Any) -> BlackjackResourcesServer:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "", "name": "blackjack", "domain": "games"} | config
    return BlackjackResourcesServer(
        config=BlackjackResourcesServerConfig(**settings), server_client=MagicMock(spec=ServerClient)
    )


def client(**config: Any) -> TestClient:
    return TestClient(make_server(**config).setup_webserver())


def turn(*items: dict[str, Any]) -> dict[str, Any]:
    return {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": list(items)}


def say(text: str) -> dict[str, Any]:
    return turn({"type": "message", "id": "m", "role": "assistant", "content": [{"type": "output_text", "text": text}]})


def act(action: str, call_id: str = "c1") -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": ACTION_TOOL,
        "arguments": json.dumps({"action": action}),
    }


def step(http: TestClient, response: dict[str, Any], row: dict[str, Any] = ROW) -> dict[str, Any]:
    answer = http.post("/step", json=row | {"response": response})
    assert answer.status_code == 200, answer.text
    return answer.json()


def stacked(player: list[str], dealer: list[str], deck_top_first: list[str]) -> Hand:
    """A hand with a chosen deck (the next card drawn is ``deck_top_first[0]``)."""
    hand = deal(0)
    hand.player, hand.dealer, hand.deck = list(player), list(dealer), list(reversed(deck_top_first))
    return hand


def play(server: BlackjackResourcesServer, hand: Hand, response: dict[str, Any]) -> dict[str, Any]:
    return server.step_episode(hand, StepRequest.model_validate(ROW | {"response": response})).model_dump()


# --- hand arithmetic ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cards", "value"),
    [
        (["2", "3"], 5),
        (["K", "Q"], 20),
        (["A", "K"], 21),
        (["A", "A"], 12),
        (["A", "A", "A", "A"], 14),
        (["A", "9", "5"], 15),  # the ace drops to 1
        (["K", "Q", "5"], 25),  # a bust stays over 21
        (["A", "A", "9"], 21),
    ],
)
def test_hand_values(cards, value):
    assert hand_value(cards) == value


def test_a_natural_is_two_cards_worth_21():
    assert is_natural(["A", "J"]) and not is_natural(["7", "7", "7"]) and not is_natural(["A", "9"])


# --- transitions -----------------------------------------------------------------------------------------------------


def test_hit_without_busting_shows_the_new_hand_and_continues():
    result = play(make_server(), stacked(["4", "9"], ["10", "3"], ["6"]), say("<action>hit</action>"))
    assert (result["reward"], result["terminated"]) == (0.0, False)
    assert "Your hand: 4, 9, 6 (value 19)" in result["observation"] and "Dealer shows: 10" in result["observation"]


def test_hit_over_21_is_a_bust_that_ends_the_episode():
    result = play(make_server(), stacked(["K", "Q"], ["5", "6"], ["2"]), say("<action>HIT</action>"))
    assert (result["reward"], result["terminated"], result["info"]["result"]) == (-1.0, True, "bust")


@pytest.mark.parametrize(
    ("player", "dealer", "deck", "result", "reward", "dealer_final"),
    [
        (["10", "8"], ["10", "6"], ["K"], "win", 1.0, 26),  # the dealer draws on 16 and busts
        (["10", "8"], ["10", "6"], ["A"], "win", 1.0, 17),  # the dealer draws to 17; 18 beats it
        (["10", "6"], ["5", "4"], ["2", "6"], "loss", -1.0, 17),  # the dealer draws twice to reach 17
        (["10", "7"], ["10", "7"], ["5"], "push", 0.0, 17),  # the dealer stands on 17
        (["10", "6"], ["10", "9"], ["5"], "loss", -1.0, 19),
        (["10", "9"], ["6", "A"], ["5"], "win", 1.0, 17),  # soft 17: the dealer stands
    ],
)
def test_stand_lets_the_dealer_draw_to_17_then_compares(player, dealer, deck, result, reward, dealer_final):
    outcome = play(make_server(), stacked(player, dealer, deck), say("<action>stand</action>"))
    assert outcome["terminated"] and (outcome["info"]["result"], outcome["reward"]) == (result, reward)
    assert outcome["info"]["dealer_value"] == dealer_final


def test_naturals_pay_the_configured_reward_and_beat_21_in_three_cards():
    natural = play(
        make_server(natural_reward=1.5), stacked(["A", "K"], ["9", "2"], ["K"]), say("<action>stand</action>")
    )
    assert (natural["info"]["result"], natural["reward"]) == ("natural", 1.5)
    both = play(make_server(), stacked(["A", "K"], ["A", "Q"], []), say("<action>stand</action>"))
    assert (both["info"]["result"], both["reward"]) == ("push", 0.0)
    dealer = play(make_server(), stacked(["7", "7", "7"], ["A", "Q"], []), say("<action>stand</action>"))
    assert (dealer["info"]["result"], dealer["reward"]) == ("loss", -1.0)


# --- action parsing --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["I think I will wait.", "<action>double</action>", "<action>hit</action> no, <action>stand</action>", ""],
)
def test_malformed_text_actions_are_an_observation_with_no_reward(text):
    hand = stacked(["4", "9"], ["10", "3"], ["6"])
    result = play(make_server(), hand, say(text))
    assert (result["reward"], result["terminated"], result["info"]["invalid_action"]) == (0.0, False, True)
    assert "<action>hit</action>" in result["observation"] and "Your hand: 4, 9 (value 13)" in result["observation"]
    assert hand.player == ["4", "9"]  # nothing happened


def test_repeated_identical_tags_are_one_action():
    result = play(
        make_server(), stacked(["10", "9"], ["10", "7"], []), say("<action>stand</action> <action>Stand</action>")
    )
    assert result["info"]["result"] == "win"


def test_a_tool_call_action_is_answered_as_its_tool_output():
    result = play(make_server(), stacked(["4", "9"], ["10", "3"], ["6"]), turn(act("hit"), act("stand", "c2")))
    assert result["observation"] is None and not result["terminated"]
    outputs = {o["call_id"]: o["output"] for o in result["info"]["tool_outputs"]}
    assert "Your hand: 4, 9, 6" in outputs["c1"] and outputs["c2"].startswith("Ignored")


def test_a_terminal_tool_call_gets_the_final_result_as_its_output():
    result = play(make_server(), stacked(["10", "9"], ["10", "7"], []), turn(act("stand")))
    assert result["terminated"] and result["reward"] == 1.0
    assert result["info"]["tool_outputs"][0]["output"].startswith("Result: win (reward 1)")


@pytest.mark.parametrize(
    "call",
    [
        {"type": "function_call", "call_id": "c1", "name": ACTION_TOOL, "arguments": "{not json"},
        {"type": "function_call", "call_id": "c1", "name": ACTION_TOOL, "arguments": '{"action": "fold"}'},
        {"type": "function_call", "call_id": "c1", "name": ACTION_TOOL, "arguments": '{"move": "hit"}'},
        {"type": "function_call", "call_id": "c1", "name": "bet", "arguments": "{}"},
    ],
)
def test_malformed_tool_calls_are_reported_in_their_tool_output(call):
    result = play(make_server(), stacked(["4", "9"], ["10", "3"], ["6"]), turn(call))
    assert result["info"]["invalid_action"] and not result["terminated"] and result["reward"] == 0.0
    assert "Your hand: 4, 9 (value 13)" in result["info"]["tool_outputs"][0]["output"]


# --- sessions, seeding, the HTTP protocol ----------------------------------------------------------------------------


def test_reset_is_deterministic_per_seed_and_differs_across_seeds():
    first, again, other = (client().post("/reset", json=generate_data.build_row(s)).json() for s in (3, 3, 4))
    assert first == again and first["observation"] != other["observation"]
    assert first["observation"].startswith("Your hand: 4, 9 (value 13)\nDealer shows: 10")


def test_a_whole_seeded_episode_over_http_and_the_session_is_closed_after_it():
    server = make_server()
    http = TestClient(server.setup_webserver())
    http.post("/reset", json=ROW)
    assert server.live_episodes == 1
    hit = step(http, say("<action>hit</action>"))
    assert not hit["terminated"] and "value 19" in hit["observation"]
    stand = step(http, say("<action>stand</action>"))
    assert stand["terminated"] and stand["reward"] == 1.0 and stand["info"]["dealer_hand"][:2] == ["10", "3"]
    assert server.live_episodes == 0
    late = http.post("/step", json=ROW | {"response": say("<action>hit</action>")})
    assert late.status_code == 409 and "/reset" in late.text


def test_step_before_reset_is_a_409():
    assert client().post("/step", json=ROW | {"response": say("<action>hit</action>")}).status_code == 409


def test_sessions_are_isolated_and_an_unseeded_row_still_plays():
    server = make_server()
    app = server.setup_webserver()
    alice, bob = TestClient(app), TestClient(app)
    alice.post("/reset", json=ROW)
    bob.post("/reset", json=generate_data.build_row(11))
    # Bob finishes his hand; Alice's deck and hand are untouched by it.
    assert step(bob, say("<action>stand</action>"))["terminated"]
    assert "value 19" in step(alice, say("<action>hit</action>"))["observation"]
    unseeded = TestClient(app).post("/reset", json={"responses_create_params": ROW["responses_create_params"]})
    assert unseeded.status_code == 200 and unseeded.json()["info"]["seed"] is None


def test_close_drops_the_episode_and_old_sessions_are_evicted():
    server = make_server(max_sessions=2)
    app = server.setup_webserver()
    players = [TestClient(app) for _ in range(3)]
    for player in players:
        player.post("/reset", json=ROW)
    assert server.live_episodes == 2
    assert players[0].post("/step", json=ROW | {"response": say("<action>hit</action>")}).status_code == 409
    assert players[2].post("/close").json() == {"closed": True} and server.live_episodes == 1
    assert players[2].post("/close").json() == {"closed": False}


def test_a_bad_seed_is_a_422():
    assert client().post("/reset", json=ROW | {"seed": "lucky"}).status_code == 422


def test_example_data_is_what_the_generator_writes():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert rows == [generate_data.build_row(seed) for seed in generate_data.EXAMPLE_SEEDS]
    assert generate_data.ACTION_TOOL == ACTION_TOOL
