"""The office world of workplace_assistant: record types, the shipped base world, and state comparison.

A world is a few tables of frozen pydantic records. The mutable tables (emails, events, tasks, customers, plots) are
what the verifier compares; the company directory and the website's visit log are read-only and shared by every
world. Records are immutable, so a fresh world is a shallow copy of the base lists and an update replaces a record.

Values are canonicalised on the way in (dates ``YYYY-MM-DD``, date-times ``YYYY-MM-DD HH:MM``, email addresses in
lower case) so that two ways of writing the same value are one state. Comparison additionally folds case and
whitespace of free text and ignores record ids, which depend only on creation order.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

WORLD_DIR = Path(__file__).parent / "data" / "world"
NOW = datetime(2024, 3, 15, 23, 59)
"""The world's fixed "now" (a Friday); relative requests ("next Monday") are relative to it."""
OWNER_NAME = "Sam Rivera"
OWNER_EMAIL = "sam.rivera@atlas-works.example"

_EMAIL_ADDRESS = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _date(value: str) -> str:
    try:
        return date.fromisoformat(value.strip()).isoformat()
    except ValueError:
        raise ValueError(f"{value!r} is not a date; use YYYY-MM-DD") from None


def _datetime(value: str) -> str:
    try:
        return datetime.fromisoformat(value.strip()).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        raise ValueError(f"{value!r} is not a date and time; use YYYY-MM-DD HH:MM") from None


def _address(value: str) -> str:
    value = value.strip().lower()
    if not _EMAIL_ADDRESS.match(value):
        raise ValueError(f"{value!r} is not an email address")
    return value


Day = Annotated[str, AfterValidator(_date)]
Moment = Annotated[str, AfterValidator(_datetime)]
Address = Annotated[str, AfterValidator(_address)]
Text = Annotated[str, Field(min_length=1, max_length=4000)]


def _choice(value: Any) -> Any:
    """Enumerations accept any case and surrounding spaces ("In Review " is "in review")."""
    return " ".join(value.split()).lower() if isinstance(value, str) else value


Stage = Annotated[Literal["backlog", "in progress", "in review", "completed"], BeforeValidator(_choice)]
Board = Annotated[Literal["design", "backend", "frontend"], BeforeValidator(_choice)]
CustomerStatus = Annotated[Literal["lead", "qualified", "proposal", "won", "lost"], BeforeValidator(_choice)]
Product = Annotated[Literal["software", "hardware", "services", "training"], BeforeValidator(_choice)]
TrafficSource = Annotated[Literal["direct", "search", "referral", "social"], BeforeValidator(_choice)]
Metric = Annotated[Literal["visits", "engaged_users", "page_views", "session_seconds"], BeforeValidator(_choice)]
Chart = Annotated[Literal["bar", "line", "scatter", "histogram"], BeforeValidator(_choice)]


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Person(Record):
    name: str
    email: Address


class Email(Record):
    email_id: str
    sender: Address
    recipient: Address
    subject: Text
    body: Text
    sent_at: Moment


class Event(Record):
    event_id: str
    title: Text
    participant_email: Address
    start: Moment
    duration_minutes: int = Field(ge=5, le=24 * 60)


class Task(Record):
    task_id: str
    title: Text
    assignee_email: Address
    stage: Stage
    due_date: Day
    board: Board


class Customer(Record):
    customer_id: str
    name: Text
    email: Address
    phone: str = Field(pattern=r"^[0-9+()\- ]{5,20}$")
    status: CustomerStatus
    product_interest: Product
    assigned_to_email: Address
    last_contact_date: Day


class Plot(Record):
    file_name: str


class Visit(Record):
    visitor_id: str
    day: Day
    page_views: int = Field(ge=1)
    session_seconds: int = Field(ge=0)
    traffic_source: TrafficSource
    engaged: bool


TABLES: dict[str, tuple[type[Record], str]] = {
    "emails": (Email, "EM"),
    "events": (Event, "EV"),
    "tasks": (Task, "TK"),
    "customers": (Customer, "CU"),
    "plots": (Plot, ""),
}
"""Mutable tables: record type and the prefix of generated ids (``EM-0061``)."""
READ_ONLY_TABLES: dict[str, type[Record]] = {"directory": Person, "visits": Visit}


class InitialState(BaseModel):
    """Records a task row adds to the base world (e.g. the email a task is about)."""

    model_config = ConfigDict(extra="forbid")

    emails: list[Email] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    tasks: list[Task] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)


@dataclass
class World:
    emails: list[Email] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    customers: list[Customer] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    directory: tuple[Person, ...] = ()
    visits: tuple[Visit, ...] = ()

    def copy(self) -> World:
        """An independent world: mutable tables are new lists of the same (immutable) records."""
        world = replace(self)
        for name in TABLES:
            setattr(world, name, list(getattr(self, name)))
        return world

    def new_id(self, table: str) -> str:
        """The next free ``PREFIX-NNNN`` id of a table."""
        model, prefix = TABLES[table]
        id_field = next(iter(model.model_fields))
        numbers = [
            int(value.split("-", 1)[1])
            for value in (getattr(record, id_field) for record in getattr(self, table))
            if value.startswith(f"{prefix}-") and value.split("-", 1)[1].isdigit()
        ]
        return f"{prefix}-{max(numbers, default=0) + 1:04d}"

    def with_additions(self, additions: InitialState) -> World:
        """A copy with a row's extra records appended; an id that already exists is an error."""
        world = self.copy()
        for table in ("emails", "events", "tasks", "customers"):
            records = getattr(world, table)
            id_field = next(iter(TABLES[table][0].model_fields))
            taken = {getattr(record, id_field) for record in records}
            for record in getattr(additions, table):
                if getattr(record, id_field) in taken:
                    raise ValueError(f"initial_state.{table}: id {getattr(record, id_field)!r} already exists")
                taken.add(getattr(record, id_field))
                records.append(record)
        return world


def read_table(path: Path, model: type[Record]) -> list[Record]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [model.model_validate(row) for row in csv.DictReader(handle)]


def write_table(path: Path, records: list[Record]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(type(records[0]).model_fields))
        writer.writeheader()
        for record in records:
            writer.writerow(record.model_dump())


@cache
def base_world(world_dir: Path = WORLD_DIR) -> World:
    """The shipped world (``data/world/*.csv``), read once per process; callers take ``.copy()``."""
    tables: dict[str, Any] = {
        table: read_table(world_dir / f"{table}.csv", model)
        for table, (model, _) in TABLES.items()
        if (world_dir / f"{table}.csv").exists()
    }
    for table, model in READ_ONLY_TABLES.items():
        tables[table] = tuple(read_table(world_dir / f"{table}.csv", model))
    return World(**tables)


# --- comparison ------------------------------------------------------------------------------------------------------


def _normal(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    return value


def table_state(records: list[Record]) -> list[tuple[tuple[str, Any], ...]]:
    """A table as a sorted list of records without their ids, free text case- and whitespace-folded."""
    rows = []
    for record in records:
        data = record.model_dump()
        id_field = next(iter(type(record).model_fields))
        if id_field.endswith("_id"):
            data.pop(id_field)
        rows.append(tuple(sorted((key, _normal(value)) for key, value in data.items())))
    return sorted(rows, key=repr)


def differing_tables(left: World, right: World) -> list[str]:
    """Names of the mutable tables whose states differ (empty: the worlds are equivalent)."""
    return [table for table in TABLES if table_state(getattr(left, table)) != table_state(getattr(right, table))]
