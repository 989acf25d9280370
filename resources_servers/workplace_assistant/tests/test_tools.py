"""workplace_assistant's tools, one area at a time, called directly on fresh copies of the shipped world."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from resources_servers.workplace_assistant.tools import TOOLS, ToolError, call_tool, tool_specs
from resources_servers.workplace_assistant.world import NOW, OWNER_EMAIL, World, base_world, differing_tables

ROSA = "rosa.dumont@atlas-works.example"  # a colleague in the generated directory


@pytest.fixture
def world() -> World:
    return base_world().copy()


def run(world: World, tool: str, /, **arguments: Any) -> Any:
    return call_tool(world, tool, arguments)


def test_there_are_25_tools_with_clean_schemas():
    specs = tool_specs()
    assert len(specs) == len(TOOLS) == 25
    assert {spec["name"].split("_")[0] for spec in specs} == {"directory", "email", "calendar", "analytics", "tasks",
                                                                "crm"}  # fmt: skip
    for spec in specs:
        assert spec["parameters"]["additionalProperties"] is False and not _schema_titles(spec["parameters"])


def _schema_titles(schema: Any) -> list[str]:
    """``title`` keywords (strings) anywhere in a schema; a property named "title" has a schema, not a string."""
    if isinstance(schema, dict):
        own = [value for key, value in schema.items() if key == "title" and isinstance(value, str)]
        return own + [title for value in schema.values() for title in _schema_titles(value)]
    if isinstance(schema, list):
        return [title for value in schema for title in _schema_titles(value)]
    return []


def test_a_fresh_copy_is_independent_of_the_base_world(world):
    run(world, "email_delete", email_id="EM-0001")
    assert len(world.emails) == len(base_world().emails) - 1
    assert differing_tables(world, base_world().copy()) == ["emails"]


def test_directory_lookup_by_partial_name(world):
    assert run(world, "directory_find_email", name="rosa") == [{"name": "Rosa Dumont", "email": ROSA}]
    assert len(run(world, "directory_find_email", name="Farah")) == 3
    assert run(world, "directory_find_email", name="Nobody") == []


# --- email -----------------------------------------------------------------------------------------------------------


def test_email_search_filters_and_sorts_newest_first(world):
    found = run(world, "email_search", query="budget", after="2024-02-01")
    assert 0 < len(found) <= 5 and all("budget" in (e["subject"] + e["body"]).lower() for e in found)
    assert [e["sent_at"] for e in found] == sorted((e["sent_at"] for e in found), reverse=True)
    assert all(e["sender"].startswith("hana") for e in run(world, "email_search", sender="hana"))
    assert run(world, "email_search", before="2024-01-01") == []


def test_email_send_reply_forward_and_delete(world):
    sent = run(world, "email_send", recipient=" Rosa.Dumont@atlas-works.example ", subject="Hi", body="Lunch?")
    assert (sent["email_id"], sent["recipient"], sent["sender"]) == ("EM-0061", ROSA, OWNER_EMAIL)
    assert sent["sent_at"] == NOW.strftime("%Y-%m-%d %H:%M")
    incoming = next(e for e in world.emails if e.recipient == OWNER_EMAIL)
    reply = run(world, "email_reply", email_id=incoming.email_id, body="Thanks!")
    assert (reply["recipient"], reply["subject"]) == (incoming.sender, f"Re: {incoming.subject}")
    again = run(world, "email_reply", email_id=reply["email_id"], body="Also...")  # replying to my own email
    assert (again["recipient"], again["subject"]) == (incoming.sender, reply["subject"])
    forward = run(world, "email_forward", email_id=incoming.email_id, recipient=ROSA)
    assert (forward["subject"], forward["body"]) == (f"Fwd: {incoming.subject}", incoming.body)
    assert run(world, "email_read", email_id="em-0061")["body"] == "Lunch?"  # ids are case-insensitive
    run(world, "email_delete", email_id="EM-0061")
    with pytest.raises(ToolError, match="EM-0061"):
        run(world, "email_read", email_id="EM-0061")


def test_email_arguments_are_validated(world):
    with pytest.raises(ValidationError):
        run(world, "email_send", recipient="not-an-address", subject="x", body="y")
    with pytest.raises(ValidationError):
        run(world, "email_send", recipient=ROSA, subject="", body="y")
    with pytest.raises(ValidationError):
        run(world, "email_send", recipient=ROSA, subject="x", body="y", cc=ROSA)


# --- calendar --------------------------------------------------------------------------------------------------------


def test_calendar_create_read_update_delete(world):
    event = run(world, "calendar_create", title="Coffee", participant_email=ROSA, start="2024-03-18T09:30:00",
                duration_minutes=15)  # fmt: skip
    assert (event["event_id"], event["start"]) == ("EV-0041", "2024-03-18 09:30")  # canonical date-time
    assert (
        run(world, "calendar_update", event_id="EV-0041", field="duration_minutes", value="45")["duration_minutes"]
        == 45
    )
    assert run(world, "calendar_update", event_id="EV-0041", field="start", value="2024-03-19 11:00")["start"] == (
        "2024-03-19 11:00"
    )
    with pytest.raises(ToolError, match="Invalid value for start"):
        run(world, "calendar_update", event_id="EV-0041", field="start", value="next week")
    assert run(world, "calendar_read", event_id="EV-0041")["title"] == "Coffee"
    run(world, "calendar_delete", event_id="EV-0041")
    with pytest.raises(ToolError):
        run(world, "calendar_delete", event_id="EV-0041")


def test_calendar_search_by_title_participant_and_dates(world):
    found = run(world, "calendar_search", query="sync", after="2024-03-18", before="2024-03-22")
    assert all("sync" in e["title"].lower() and "2024-03-18" <= e["start"][:10] <= "2024-03-22" for e in found)
    assert [e["start"] for e in found] == sorted(e["start"] for e in found)
    assert all(e["participant_email"] == ROSA for e in run(world, "calendar_search", participant_email=ROSA))


# --- analytics -------------------------------------------------------------------------------------------------------


def test_analytics_counts_agree_with_the_visit_log(world):
    week = {"start_date": "2024-03-01", "end_date": "2024-03-07"}
    visits = [v for v in world.visits if "2024-03-01" <= v.day <= "2024-03-07"]
    counted = run(world, "analytics_visits", **week)
    assert counted["total"] == len(visits) and sum(counted["per_day"].values()) == len(visits)
    assert run(world, "analytics_engaged_users", **week) == {"engaged_users": sum(v.engaged for v in visits)}
    search = sum(v.traffic_source == "search" for v in visits)
    assert run(world, "analytics_traffic_source", **week, traffic_source="search") == {"visits": search}
    average = run(world, "analytics_average_session", **week)["average_session_seconds"]
    assert average == pytest.approx(sum(v.session_seconds for v in visits) / len(visits), abs=0.05)


def test_analytics_rejects_bad_ranges_and_empty_ones(world):
    with pytest.raises(ValidationError, match="before start_date"):
        run(world, "analytics_visits", start_date="2024-03-07", end_date="2024-03-01")
    with pytest.raises(ValidationError):
        run(world, "analytics_traffic_source", start_date="2024-03-01", end_date="2024-03-07", traffic_source="tv")
    with pytest.raises(ToolError, match="No visits"):
        run(world, "analytics_average_session", start_date="2023-01-01", end_date="2023-01-31")


def test_a_plot_is_a_file_and_saving_it_twice_changes_nothing(world):
    arguments = {"start_date": "2024-03-01", "end_date": "2024-03-07", "metric": "visits", "chart": "line"}
    assert run(world, "analytics_create_plot", **arguments) == {
        "file_name": "plots/2024-03-01_2024-03-07_visits_line.png"
    }
    run(world, "analytics_create_plot", **arguments)
    assert len(world.plots) == 1


# --- tasks and customers ---------------------------------------------------------------------------------------------


def test_tasks_create_search_update_delete(world):
    task = run(world, "tasks_create", title="Write launch post", assignee_email=ROSA, due_date="2024-03-22",
               board="frontend")  # fmt: skip
    assert (task["task_id"], task["stage"]) == ("TK-0041", "backlog")
    assert run(world, "tasks_search", title="launch post")[0]["task_id"] == "TK-0041"
    assert run(world, "tasks_update", task_id="TK-0041", field="stage", value=" In  Review")["stage"] == "in review"
    with pytest.raises(ToolError, match="Invalid value for stage"):
        run(world, "tasks_update", task_id="TK-0041", field="stage", value="shipped")
    with pytest.raises(ToolError, match="directory"):
        run(world, "tasks_update", task_id="TK-0041", field="assignee_email", value="someone@else.example")
    run(world, "tasks_delete", task_id="TK-0041")
    assert run(world, "tasks_search", title="launch post") == []


def test_tasks_search_filters(world):
    found = run(world, "tasks_search", board="backend", stage="backlog", due_before="2024-04-30")
    assert found and all(t["board"] == "backend" and t["stage"] == "backlog" for t in found)
    with pytest.raises(ToolError, match="directory"):
        run(
            world,
            "tasks_create",
            title="x",
            assignee_email="stranger@else.example",
            due_date="2024-03-22",
            board="design",
        )


def test_customers_search_update_add(world):
    proposals = run(world, "crm_search", status="proposal")
    assert proposals and all(c["status"] == "proposal" for c in proposals)
    target = proposals[0]["customer_id"]
    assert run(world, "crm_update", customer_id=target, field="status", value="won")["status"] == "won"
    with pytest.raises(ToolError):
        run(world, "crm_update", customer_id=target, field="status", value="maybe")
    added = run(world, "crm_add", name="Zephyr Tools", email="hello@zephyr.example", phone="+1 555 010 2000",
                product_interest="hardware", assigned_to_email=ROSA)  # fmt: skip
    assert (added["customer_id"], added["status"], added["last_contact_date"]) == ("CU-0041", "lead", "2024-03-15")
    assert run(world, "crm_search", name="zephyr")[0]["email"] == "hello@zephyr.example"
