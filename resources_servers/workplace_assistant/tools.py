"""The 25 office tools of workplace_assistant: argument models, behaviour, and their function-tool schemas.

Every tool is a plain function ``(world, arguments) -> JSON-ready result`` registered with :func:`tool`, so the same
code serves live tool calls (one route per tool) and the verifier's replays on fresh worlds. A tool that cannot do
what was asked raises :class:`ToolError`, whose message the model reads. Searches return at most ``SEARCH_LIMIT``
records, so vague queries have to be refined, as with a real mailbox.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from resources_servers.workplace_assistant.world import (
    NOW,
    OWNER_EMAIL,
    TABLES,
    Address,
    Board,
    Chart,
    Customer,
    CustomerStatus,
    Day,
    Email,
    Event,
    Metric,
    Moment,
    Plot,
    Product,
    Record,
    Stage,
    Task,
    Text,
    TrafficSource,
    Visit,
    World,
)

SEARCH_LIMIT = 5
DIRECTORY_LIMIT = 10


class ToolError(Exception):
    """The tool ran but could not do what was asked (unknown id, bad value); the message is for the model."""


class Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[Arguments]
    run: Callable[[World, Any], Any]


TOOLS: dict[str, Tool] = {}


def tool(name: str, description: str, arguments: type[Arguments]) -> Callable[[Callable], Callable]:
    def register(run: Callable[[World, Any], Any]) -> Callable[[World, Any], Any]:
        TOOLS[name] = Tool(name, description, arguments, run)
        return run

    return register


def call_tool(world: World, name: str, arguments: dict[str, Any]) -> Any:
    """Validate and run one call. Raises KeyError (unknown tool), ValidationError or ToolError."""
    spec = TOOLS[name]
    return spec.run(world, spec.arguments.model_validate(arguments))


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {key: _strip_titles(value) for key, value in schema.items() if key != "title"}
    if isinstance(schema, list):
        return [_strip_titles(value) for value in schema]
    return schema


def tool_specs() -> list[dict[str, Any]]:
    """The Responses ``function`` tools a row offers, derived from the argument models."""
    specs = []
    for spec in TOOLS.values():
        parameters = _strip_titles(spec.arguments.model_json_schema())
        parameters["additionalProperties"] = False
        parameters.setdefault("properties", {})
        specs.append(
            {"type": "function", "name": spec.name, "description": spec.description, "parameters": parameters,
             "strict": False}
        )  # fmt: skip
    return specs


def _contains(haystack: str, needle: str | None) -> bool:
    return needle is None or needle.strip().casefold() in haystack.casefold()


def _find(world: World, table: str, record_id: str) -> tuple[int, Record]:
    id_field = next(iter(TABLES[table][0].model_fields))
    for index, record in enumerate(getattr(world, table)):
        if getattr(record, id_field).upper() == record_id.strip().upper():
            return index, record
    raise ToolError(f"No record with {id_field} {record_id!r}.")


def _update(world: World, table: str, record_id: str, field: str, value: str) -> dict[str, Any]:
    index, record = _find(world, table, record_id)
    try:
        updated = type(record).model_validate(record.model_dump() | {field: value})
    except ValidationError as e:
        raise ToolError(f"Invalid value for {field}: {e.errors()[0]['msg']}") from None
    getattr(world, table)[index] = updated
    return updated.model_dump()


def _delete(world: World, table: str, record_id: str) -> dict[str, Any]:
    index, record = _find(world, table, record_id)
    del getattr(world, table)[index]
    return {"deleted": record.model_dump()}


def _require_colleague(world: World, address: str) -> None:
    if address not in {person.email for person in world.directory}:
        raise ToolError(f"{address} is not in the company directory.")


# --- directory and email ---------------------------------------------------------------------------------------------


class FindEmailArguments(Arguments):
    name: str = Field(min_length=1, description="Full or partial name of a colleague.")


@tool("directory_find_email", "Look up colleagues' email addresses by (part of) their name.", FindEmailArguments)
def directory_find_email(world: World, args: FindEmailArguments) -> list[dict[str, str]]:
    matches = [person.model_dump() for person in world.directory if _contains(person.name, args.name)]
    return matches[:DIRECTORY_LIMIT]


class EmailSearchArguments(Arguments):
    query: str | None = Field(None, description="Text to find in the subject or body.")
    sender: str | None = Field(None, description="(Part of) the sender's email address.")
    after: Day | None = Field(None, description="Only emails sent on or after this date (YYYY-MM-DD).")
    before: Day | None = Field(None, description="Only emails sent on or before this date (YYYY-MM-DD).")


@tool("email_search", f"Search the mailbox; newest first, at most {SEARCH_LIMIT} emails.", EmailSearchArguments)
def email_search(world: World, args: EmailSearchArguments) -> list[dict[str, Any]]:
    found = [
        email
        for email in world.emails
        if (_contains(email.subject, args.query) or _contains(email.body, args.query))
        and _contains(email.sender, args.sender)
        and (args.after is None or email.sent_at[:10] >= args.after)
        and (args.before is None or email.sent_at[:10] <= args.before)
    ]
    found.sort(key=lambda email: email.sent_at, reverse=True)
    return [email.model_dump() for email in found[:SEARCH_LIMIT]]


class EmailIdArguments(Arguments):
    email_id: str = Field(description="Id of the email, e.g. EM-0012.")


@tool("email_read", "Read one email by id.", EmailIdArguments)
def email_read(world: World, args: EmailIdArguments) -> dict[str, Any]:
    return _find(world, "emails", args.email_id)[1].model_dump()


def _send(world: World, recipient: str, subject: str, body: str) -> dict[str, Any]:
    email = Email(
        email_id=world.new_id("emails"), sender=OWNER_EMAIL, recipient=recipient, subject=subject, body=body,
        sent_at=NOW.isoformat(sep=" "),
    )  # fmt: skip
    world.emails.append(email)
    return email.model_dump()


class EmailSendArguments(Arguments):
    recipient: Address = Field(description="Recipient's email address.")
    subject: Text
    body: Text


@tool("email_send", "Send a new email from the user's mailbox.", EmailSendArguments)
def email_send(world: World, args: EmailSendArguments) -> dict[str, Any]:
    return _send(world, args.recipient, args.subject, args.body)


class EmailReplyArguments(EmailIdArguments):
    body: Text


@tool("email_reply", "Reply to an email (to its sender, subject 'Re: ...').", EmailReplyArguments)
def email_reply(world: World, args: EmailReplyArguments) -> dict[str, Any]:
    original = world.emails[_find(world, "emails", args.email_id)[0]]
    to = original.recipient if original.sender == OWNER_EMAIL else original.sender
    subject = original.subject if original.subject.lower().startswith("re:") else f"Re: {original.subject}"
    return _send(world, to, subject, args.body)


class EmailForwardArguments(EmailIdArguments):
    recipient: Address


@tool("email_forward", "Forward an email to someone (subject 'Fwd: ...', same body).", EmailForwardArguments)
def email_forward(world: World, args: EmailForwardArguments) -> dict[str, Any]:
    original = world.emails[_find(world, "emails", args.email_id)[0]]
    return _send(world, args.recipient, f"Fwd: {original.subject}", original.body)


@tool("email_delete", "Delete an email by id.", EmailIdArguments)
def email_delete(world: World, args: EmailIdArguments) -> dict[str, Any]:
    return _delete(world, "emails", args.email_id)


# --- calendar --------------------------------------------------------------------------------------------------------


class CalendarSearchArguments(Arguments):
    query: str | None = Field(None, description="Text to find in the event title.")
    participant_email: str | None = Field(None, description="(Part of) the participant's email address.")
    after: Day | None = Field(None, description="Only events starting on or after this date (YYYY-MM-DD).")
    before: Day | None = Field(None, description="Only events starting on or before this date (YYYY-MM-DD).")


@tool("calendar_search", f"Search calendar events; earliest first, at most {SEARCH_LIMIT}.", CalendarSearchArguments)
def calendar_search(world: World, args: CalendarSearchArguments) -> list[dict[str, Any]]:
    found = [
        event
        for event in world.events
        if _contains(event.title, args.query)
        and _contains(event.participant_email, args.participant_email)
        and (args.after is None or event.start[:10] >= args.after)
        and (args.before is None or event.start[:10] <= args.before)
    ]
    found.sort(key=lambda event: event.start)
    return [event.model_dump() for event in found[:SEARCH_LIMIT]]


class EventIdArguments(Arguments):
    event_id: str = Field(description="Id of the event, e.g. EV-0007.")


@tool("calendar_read", "Read one calendar event by id.", EventIdArguments)
def calendar_read(world: World, args: EventIdArguments) -> dict[str, Any]:
    return _find(world, "events", args.event_id)[1].model_dump()


class CalendarCreateArguments(Arguments):
    title: Text
    participant_email: Address
    start: Moment = Field(description="Start, YYYY-MM-DD HH:MM (24-hour clock).")
    duration_minutes: int = Field(ge=5, le=24 * 60)


@tool("calendar_create", "Create a calendar event with one participant.", CalendarCreateArguments)
def calendar_create(world: World, args: CalendarCreateArguments) -> dict[str, Any]:
    event = Event(event_id=world.new_id("events"), **args.model_dump())
    world.events.append(event)
    return event.model_dump()


class CalendarUpdateArguments(EventIdArguments):
    field: Literal["title", "participant_email", "start", "duration_minutes"]
    value: str = Field(description="The new value, as text (start: YYYY-MM-DD HH:MM).")


@tool("calendar_update", "Change one field of a calendar event.", CalendarUpdateArguments)
def calendar_update(world: World, args: CalendarUpdateArguments) -> dict[str, Any]:
    return _update(world, "events", args.event_id, args.field, args.value)


@tool("calendar_delete", "Delete a calendar event by id.", EventIdArguments)
def calendar_delete(world: World, args: EventIdArguments) -> dict[str, Any]:
    return _delete(world, "events", args.event_id)


# --- website analytics (read-only visit log, plus plots) -------------------------------------------------------------


class DateRangeArguments(Arguments):
    start_date: Day = Field(description="First day, YYYY-MM-DD (inclusive).")
    end_date: Day = Field(description="Last day, YYYY-MM-DD (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> DateRangeArguments:
        if self.end_date < self.start_date:
            raise ValueError("end_date is before start_date")
        return self


def _visits(world: World, args: DateRangeArguments) -> list[Visit]:
    return [visit for visit in world.visits if args.start_date <= visit.day <= args.end_date]


@tool("analytics_visits", "Number of website visits in a date range, in total and per day.", DateRangeArguments)
def analytics_visits(world: World, args: DateRangeArguments) -> dict[str, Any]:
    per_day: dict[str, int] = {}
    for visit in _visits(world, args):
        per_day[visit.day] = per_day.get(visit.day, 0) + 1
    return {"total": sum(per_day.values()), "per_day": dict(sorted(per_day.items()))}


@tool("analytics_engaged_users", "Number of engaged visits in a date range.", DateRangeArguments)
def analytics_engaged_users(world: World, args: DateRangeArguments) -> dict[str, int]:
    return {"engaged_users": sum(visit.engaged for visit in _visits(world, args))}


class TrafficSourceArguments(DateRangeArguments):
    traffic_source: TrafficSource


@tool("analytics_traffic_source", "Number of visits from one traffic source in a date range.", TrafficSourceArguments)
def analytics_traffic_source(world: World, args: TrafficSourceArguments) -> dict[str, int]:
    return {"visits": sum(visit.traffic_source == args.traffic_source for visit in _visits(world, args))}


@tool("analytics_average_session", "Average visit duration in seconds over a date range.", DateRangeArguments)
def analytics_average_session(world: World, args: DateRangeArguments) -> dict[str, float]:
    visits = _visits(world, args)
    if not visits:
        raise ToolError(f"No visits between {args.start_date} and {args.end_date}.")
    return {"average_session_seconds": round(fmean(visit.session_seconds for visit in visits), 1)}


class CreatePlotArguments(DateRangeArguments):
    metric: Metric
    chart: Chart


@tool(
    "analytics_create_plot", "Save a chart of a daily metric over a date range; returns its file.", CreatePlotArguments
)
def analytics_create_plot(world: World, args: CreatePlotArguments) -> dict[str, str]:
    plot = Plot(file_name=f"plots/{args.start_date}_{args.end_date}_{args.metric}_{args.chart}.png")
    if plot not in world.plots:  # the same chart is the same file: saving it again changes nothing
        world.plots.append(plot)
    return plot.model_dump()


# --- project tasks ---------------------------------------------------------------------------------------------------


class TaskSearchArguments(Arguments):
    title: str | None = Field(None, description="Text to find in the task title.")
    assignee_email: str | None = Field(None, description="(Part of) the assignee's email address.")
    stage: Stage | None = None
    board: Board | None = None
    due_before: Day | None = Field(None, description="Only tasks due on or before this date (YYYY-MM-DD).")


@tool("tasks_search", f"Search project tasks; soonest due first, at most {SEARCH_LIMIT}.", TaskSearchArguments)
def tasks_search(world: World, args: TaskSearchArguments) -> list[dict[str, Any]]:
    found = [
        task
        for task in world.tasks
        if _contains(task.title, args.title)
        and _contains(task.assignee_email, args.assignee_email)
        and args.stage in (None, task.stage)
        and args.board in (None, task.board)
        and (args.due_before is None or task.due_date <= args.due_before)
    ]
    found.sort(key=lambda task: (task.due_date, task.task_id))
    return [task.model_dump() for task in found[:SEARCH_LIMIT]]


class TaskIdArguments(Arguments):
    task_id: str = Field(description="Id of the task, e.g. TK-0003.")


@tool("tasks_read", "Read one project task by id.", TaskIdArguments)
def tasks_read(world: World, args: TaskIdArguments) -> dict[str, Any]:
    return _find(world, "tasks", args.task_id)[1].model_dump()


class TaskCreateArguments(Arguments):
    title: Text
    assignee_email: Address = Field(description="A colleague's email address.")
    due_date: Day
    board: Board
    stage: Stage = "backlog"


@tool("tasks_create", "Create a project task for a colleague.", TaskCreateArguments)
def tasks_create(world: World, args: TaskCreateArguments) -> dict[str, Any]:
    _require_colleague(world, args.assignee_email)
    task = Task(task_id=world.new_id("tasks"), **args.model_dump())
    world.tasks.append(task)
    return task.model_dump()


class TaskUpdateArguments(TaskIdArguments):
    field: Literal["title", "assignee_email", "stage", "due_date", "board"]
    value: str = Field(
        description="The new value, as text. stage: backlog, in progress, in review or completed; board: design, "
        "backend or frontend; due_date: YYYY-MM-DD; assignee_email: a colleague's address."
    )


@tool("tasks_update", "Change one field of a project task (e.g. move it to another stage).", TaskUpdateArguments)
def tasks_update(world: World, args: TaskUpdateArguments) -> dict[str, Any]:
    if args.field == "assignee_email":
        _require_colleague(world, args.value.strip().lower())
    return _update(world, "tasks", args.task_id, args.field, args.value)


@tool("tasks_delete", "Delete a project task by id.", TaskIdArguments)
def tasks_delete(world: World, args: TaskIdArguments) -> dict[str, Any]:
    return _delete(world, "tasks", args.task_id)


# --- customers -------------------------------------------------------------------------------------------------------


class CustomerSearchArguments(Arguments):
    name: str | None = Field(None, description="(Part of) the customer's name.")
    email: str | None = None
    status: CustomerStatus | None = None
    product_interest: Product | None = None
    assigned_to_email: str | None = Field(None, description="(Part of) the account manager's email address.")


@tool("crm_search", f"Search customers; by name, at most {SEARCH_LIMIT}.", CustomerSearchArguments)
def crm_search(world: World, args: CustomerSearchArguments) -> list[dict[str, Any]]:
    found = [
        customer
        for customer in world.customers
        if _contains(customer.name, args.name)
        and _contains(customer.email, args.email)
        and args.status in (None, customer.status)
        and args.product_interest in (None, customer.product_interest)
        and _contains(customer.assigned_to_email, args.assigned_to_email)
    ]
    found.sort(key=lambda customer: (customer.name, customer.customer_id))
    return [customer.model_dump() for customer in found[:SEARCH_LIMIT]]


class CustomerUpdateArguments(Arguments):
    customer_id: str = Field(description="Id of the customer, e.g. CU-0021.")
    field: Literal["name", "email", "phone", "status", "product_interest", "assigned_to_email", "last_contact_date"]
    value: str = Field(
        description="The new value, as text. status: lead, qualified, proposal, won or lost; product_interest: "
        "software, hardware, services or training; last_contact_date: YYYY-MM-DD."
    )


@tool("crm_update", "Change one field of a customer record.", CustomerUpdateArguments)
def crm_update(world: World, args: CustomerUpdateArguments) -> dict[str, Any]:
    if args.field == "assigned_to_email":
        _require_colleague(world, args.value.strip().lower())
    return _update(world, "customers", args.customer_id, args.field, args.value)


class CustomerAddArguments(Arguments):
    name: Text
    email: Address
    phone: str = Field(pattern=r"^[0-9+()\- ]{5,20}$")
    status: CustomerStatus = "lead"
    product_interest: Product
    assigned_to_email: Address = Field(description="The account manager (a colleague).")
    last_contact_date: Day = Field(NOW.date().isoformat(), description="Defaults to today.")


@tool("crm_add", "Add a customer record.", CustomerAddArguments)
def crm_add(world: World, args: CustomerAddArguments) -> dict[str, Any]:
    _require_colleague(world, args.assigned_to_email)
    customer = Customer(customer_id=world.new_id("customers"), **args.model_dump())
    world.customers.append(customer)
    return customer.model_dump()
