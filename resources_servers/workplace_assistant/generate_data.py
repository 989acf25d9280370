"""Generate workplace_assistant's synthetic office: the base world (``data/world/*.csv``) and the example tasks.

Every name, email, event, task, customer and website visit is made up here from small word lists, by one seeded
``random.Random``, so the output is identical on every run (and the tests check that the committed files are exactly
what this script writes). Run from the repository root::

    python -m resources_servers.workplace_assistant.generate_data

Tasks are built from records of the generated world, and each carries its ground-truth calls, which the tests replay:
five examples (``data/example.jsonl``), and beside them a small train split (``train.jsonl``, 20 tasks) and a
validation split (``validation.jsonl``, 5 tasks) that the environment declares for ``gym dataset collate --mode
train_preparation``, so preparing training data needs no download.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from resources_servers.workplace_assistant.tools import tool_specs
from resources_servers.workplace_assistant.world import (
    NOW,
    OWNER_EMAIL,
    OWNER_NAME,
    WORLD_DIR,
    Customer,
    Email,
    Event,
    Person,
    Task,
    Visit,
    write_table,
)

SEED = 20240315
DOMAIN = "atlas-works.example"
FIRST_NAMES = (
    "Amara", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Gustav", "Hana", "Ivo", "Jonas", "Keiko", "Lior", "Mateo",
    "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Talia", "Umar", "Vera",
)  # fmt: skip
LAST_NAMES = (
    "Abara", "Bianchi", "Castell", "Dumont", "Eklund", "Fontaine", "Garrido", "Halvorsen", "Ilic", "Jansen",
    "Kowal", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quist", "Rahman", "Sato", "Teixeira",
)  # fmt: skip
TOPICS = (
    "Q1 budget", "website redesign", "vendor contract", "office move", "hiring plan", "security audit",
    "customer survey", "release schedule", "training day", "travel policy", "quarterly report", "data migration",
)  # fmt: skip
EMAIL_OPENERS = (
    "Quick update on the {topic}.", "Can we talk about the {topic} this week?", "Attached are my notes on the {topic}.",
    "The {topic} needs a decision by Friday.", "Thanks for your input on the {topic}.",
)  # fmt: skip
EMAIL_CLOSERS = ("Let me know what you think.", "No rush.", "Happy to discuss.", "Talk soon.", "Thanks!")
EVENT_TITLES = (
    "Weekly sync", "Design review", "Budget planning", "Roadmap check-in", "Customer call prep", "1:1",
    "Sprint retro", "Hiring debrief",
)  # fmt: skip
TASK_VERBS = ("Update", "Fix", "Draft", "Review", "Test", "Document", "Plan", "Clean up")
TASK_OBJECTS = (
    "onboarding guide", "login timeout", "pricing page", "API rate limits", "invoice export", "search filters",
    "mobile menu", "release notes", "error dashboard", "signup form", "cache settings", "style guide",
)  # fmt: skip
COMPANY_PREFIXES = (
    "Bluefield", "Cedarline", "Harborview", "Ironleaf", "Juniper", "Kestrel", "Lumenway", "Maplecrest", "Nimbusly",
    "Orchidea", "Pinecrest", "Quartzite", "Redfern", "Silverton", "Tidewater", "Upland",
)  # fmt: skip
COMPANY_SUFFIXES = ("Foods", "Logistics", "Clinics", "Labs", "Outfitters", "Studios", "Builders", "Hotels")

SYSTEM_PROMPT = (
    f"Today is {NOW:%A, %Y-%m-%d}, and the time is {NOW:%H:%M}. You are the office assistant of {OWNER_NAME} "
    f"({OWNER_EMAIL}) at Atlas Works. Carry out the request with the tools: look up what you need, make exactly the "
    "changes asked for and nothing else, then reply with a one-sentence summary."
)


def _person(first: str, last: str) -> Person:
    return Person(name=f"{first} {last}", email=f"{first}.{last}@{DOMAIN}".lower())


def _moment(day: date, hour: int, minute: int = 0) -> str:
    return datetime(day.year, day.month, day.day, hour, minute).strftime("%Y-%m-%d %H:%M")


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def build_world(rng: random.Random) -> dict[str, list[Any]]:
    """All tables of the base world, as lists of records."""
    names = rng.sample([(f, last) for f in FIRST_NAMES for last in LAST_NAMES], 20)
    directory = [Person(name=OWNER_NAME, email=OWNER_EMAIL)] + [_person(first, last) for first, last in names]
    colleagues = directory[1:]
    workdays = [d for d in _days(date(2024, 2, 19), date(2024, 4, 12)) if d.weekday() < 5]
    past = [d for d in workdays if d <= NOW.date()]

    emails = []
    for i in range(60):
        other, topic, day = rng.choice(colleagues), rng.choice(TOPICS), rng.choice(past)
        incoming = rng.random() < 0.7
        opener = rng.choice(EMAIL_OPENERS).format(topic=topic)
        body = f"{opener[0].lower()}{opener[1:]} {rng.choice(EMAIL_CLOSERS)}"
        emails.append(
            Email(
                email_id=f"EM-{i + 1:04d}", sender=other.email if incoming else OWNER_EMAIL,
                recipient=OWNER_EMAIL if incoming else other.email, subject=topic[0].upper() + topic[1:],
                body=f"Hi {OWNER_NAME.split()[0] if incoming else other.name.split()[0]}, {body}",
                sent_at=_moment(day, rng.randint(8, 18), rng.choice((0, 10, 25, 40, 55))),
            )
        )  # fmt: skip

    events = [
        Event(
            event_id=f"EV-{i + 1:04d}", title=rng.choice(EVENT_TITLES), participant_email=rng.choice(colleagues).email,
            start=_moment(rng.choice(workdays), rng.randint(9, 16), rng.choice((0, 30))),
            duration_minutes=rng.choice((30, 45, 60, 90)),
        )
        for i in range(40)
    ]  # fmt: skip

    titles = rng.sample([f"{verb} {obj}" for verb in TASK_VERBS for obj in TASK_OBJECTS], 40)
    tasks = [
        Task(
            task_id=f"TK-{i + 1:04d}", title=title, assignee_email=rng.choice(colleagues).email,
            stage=rng.choice(("backlog", "in progress", "in review", "completed")),
            due_date=rng.choice(workdays).isoformat(), board=rng.choice(("design", "backend", "frontend")),
        )
        for i, title in enumerate(titles)
    ]  # fmt: skip

    companies = rng.sample([f"{p} {s}" for p in COMPANY_PREFIXES for s in COMPANY_SUFFIXES], 40)
    customers = [
        Customer(
            customer_id=f"CU-{i + 1:04d}", name=company,
            email=f"contact@{company.lower().replace(' ', '-')}.example",
            phone=f"+1 555 {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
            status=rng.choice(("lead", "qualified", "proposal", "won", "lost")),
            product_interest=rng.choice(("software", "hardware", "services", "training")),
            assigned_to_email=rng.choice(colleagues).email, last_contact_date=rng.choice(past).isoformat(),
        )
        for i, company in enumerate(companies)
    ]  # fmt: skip

    visits: list[Visit] = []
    for day in _days(date(2024, 2, 1), NOW.date()):
        for _ in range(rng.randint(6, 16)):
            visits.append(
                Visit(
                    visitor_id=f"VS-{len(visits) + 1:05d}", day=day.isoformat(), page_views=rng.randint(1, 12),
                    session_seconds=rng.randint(5, 900),
                    traffic_source=rng.choices(("direct", "search", "referral", "social"), (3, 5, 1, 2))[0],
                    engaged=rng.random() < 0.45,
                )
            )  # fmt: skip
    return {"directory": directory, "emails": emails, "events": events, "tasks": tasks, "customers": customers,
            "visits": visits}  # fmt: skip


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments)}


def row(request: str, ground_truth: list[dict[str, Any]], category: str, **extra: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": request}],
            "tools": tool_specs(),
            "parallel_tool_calls": False,
        },
        "ground_truth": ground_truth,
        "category": category,
        **extra,
    }


def build_examples(rng: random.Random, world: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Five tasks, one per area; each names its records the way a person would (names, titles, dates), not by id."""
    colleagues = world["directory"][1:]
    first_names = [person.name.split()[0] for person in colleagues]
    sender = rng.choice([p for p in colleagues if first_names.count(p.name.split()[0]) == 1])  # "Soren's email"
    invitee = rng.choice([p for p in colleagues if p != sender])

    extra_email = Email(
        email_id="EM-0500", sender=sender.email, recipient=OWNER_EMAIL, subject="Server migration window",
        body=f"Hi {OWNER_NAME.split()[0]}, would Friday at 18:00 work for the server migration? {sender.name}",
        sent_at=_moment(NOW.date(), 17, 5),
    )  # fmt: skip
    reply_body = "Friday at 18:00 works for me."
    email_row = row(
        f"Reply to {sender.name.split()[0]}'s email about the server migration with: '{reply_body}'",
        [call("email_reply", email_id=extra_email.email_id, body=reply_body)],
        "email",
        initial_state={"emails": [extra_email.model_dump()]},
    )

    calendar_row = row(
        f"Schedule a 30-minute 'Hiring sync' with {invitee.name} next Monday at 10:00.",
        [call("calendar_create", title="Hiring sync", participant_email=invitee.email, start="2024-03-18 10:00",
              duration_minutes=30)],
        "calendar",
    )  # fmt: skip

    open_tasks = [t for t in world["tasks"] if t.stage != "completed"]
    titles = [t.title for t in world["tasks"]]
    task = rng.choice([t for t in open_tasks if titles.count(t.title) == 1])
    task_row = row(
        f"The task '{task.title}' on the {task.board} board is done; mark it as completed.",
        [call("tasks_update", task_id=task.task_id, field="stage", value="completed")],
        "tasks",
    )

    customer = rng.choice([c for c in world["customers"] if c.status == "proposal"])
    crm_row = row(
        f"{customer.name} just signed: set their status to won and their last contact date to today.",
        [call("crm_update", customer_id=customer.customer_id, field="status", value="won"),
         call("crm_update", customer_id=customer.customer_id, field="last_contact_date", value=NOW.date().isoformat())],
        "crm",
    )  # fmt: skip

    analytics_row = row(
        "Make a bar chart of engaged users for the first week of March (March 1 to March 7).",
        [call("analytics_create_plot", start_date="2024-03-01", end_date="2024-03-07", metric="engaged_users",
              chart="bar")],
        "analytics",
    )  # fmt: skip
    return [email_row, calendar_row, task_row, crm_row, analytics_row]


TRAIN_ROWS = 20
VALIDATION_ROWS = 5
SPLIT_SEED = SEED + 1
"""The train and validation tasks come from their own generator, so adding them left the examples unchanged."""
MAIL_SUBJECTS = (
    "Server migration window", "Offsite agenda", "Contract renewal", "Hiring panel", "Budget sign-off",
    "Conference booth", "Laptop refresh", "Holiday rota",
)  # fmt: skip
MAIL_QUESTIONS = (
    "could you confirm by Monday?", "does the plan work for you?", "can you make the proposed time?",
    "do you agree with the numbers?",
)  # fmt: skip
REPLIES = ("Confirmed, thanks.", "Works for me.", "Yes, count me in.", "Let's go ahead.", "Sounds good to me.")
NEW_EVENT_TITLES = ("Hiring sync", "Vendor demo", "Quarterly review", "Launch planning", "Budget walkthrough")
CHART_WORDS = {"bar": "bar chart", "line": "line chart", "scatter": "scatter plot", "histogram": "histogram"}
CRM_CHANGES = {  # current status -> (request, new status)
    "proposal": ("{name} just signed: set their status to won and their last contact date to today.", "won"),
    "qualified": ("We sent {name} a proposal today: set their status to proposal and their last contact date to "
                  "today.", "proposal"),
    "lead": ("{name} went with a competitor: set their status to lost and their last contact date to today.", "lost"),
}  # fmt: skip


def build_split_tasks(
    rng: random.Random, world: dict[str, list[Any]], count: int, taken: set[str]
) -> list[dict[str, Any]]:
    """``count`` tasks cycling through the five areas; no two change the same task or customer, and none changes
    one in ``taken`` (the records the examples change)."""
    colleagues = world["directory"][1:]
    first_names = [person.name.split()[0] for person in colleagues]
    senders = [p for p in colleagues if first_names.count(p.name.split()[0]) == 1]
    titles = [t.title for t in world["tasks"]]
    tasks = [t for t in world["tasks"] if titles.count(t.title) == 1 and t.task_id not in taken]
    rng.shuffle(tasks)
    customers = [c for c in world["customers"] if c.status in CRM_CHANGES and c.customer_id not in taken]
    rng.shuffle(customers)
    next_week = _days(date(2024, 3, 18), date(2024, 3, 22))
    visit_days = _days(date(2024, 2, 1), NOW.date())
    rows = []
    for i in range(count):
        area = ("email", "calendar", "tasks", "crm", "analytics")[i % 5]
        if area == "email":
            sender, subject, reply = rng.choice(senders), rng.choice(MAIL_SUBJECTS), rng.choice(REPLIES)
            mail = Email(
                email_id=f"EM-{501 + i:04d}", sender=sender.email, recipient=OWNER_EMAIL, subject=subject,
                body=f"Hi {OWNER_NAME.split()[0]}, about the {subject.lower()}: {rng.choice(MAIL_QUESTIONS)} "
                     f"{sender.name}",
                sent_at=_moment(NOW.date(), rng.randint(9, 17), rng.choice((5, 20, 35, 50))),
            )  # fmt: skip
            rows.append(row(
                f"Reply to {sender.name.split()[0]}'s email about the {subject.lower()} with: '{reply}'",
                [call("email_reply", email_id=mail.email_id, body=reply)], area,
                initial_state={"emails": [mail.model_dump()]},
            ))  # fmt: skip
        elif area == "calendar":
            invitee, title, day = rng.choice(colleagues), rng.choice(NEW_EVENT_TITLES), rng.choice(next_week)
            hour, minutes = rng.randint(9, 16), rng.choice((30, 45, 60))
            rows.append(row(
                f"Schedule a {minutes}-minute '{title}' with {invitee.name} next {day:%A} at {hour:02d}:00.",
                [call("calendar_create", title=title, participant_email=invitee.email, start=_moment(day, hour),
                      duration_minutes=minutes)],
                area,
            ))  # fmt: skip
        elif area == "tasks":
            task = tasks.pop()
            stage = rng.choice([s for s in ("in progress", "in review", "completed") if s != task.stage])
            rows.append(row(
                f"Move the task '{task.title}' on the {task.board} board to '{stage}'.",
                [call("tasks_update", task_id=task.task_id, field="stage", value=stage)], area,
            ))  # fmt: skip
        elif area == "crm":
            customer = customers.pop()
            request, status = CRM_CHANGES[customer.status]
            rows.append(row(
                request.format(name=customer.name),
                [call("crm_update", customer_id=customer.customer_id, field="status", value=status),
                 call("crm_update", customer_id=customer.customer_id, field="last_contact_date",
                      value=NOW.date().isoformat())],
                area,
            ))  # fmt: skip
        else:
            start = rng.choice(visit_days[:-7])
            end = start + timedelta(days=rng.randint(3, 7))
            metric, chart = (
                rng.choice(("visits", "engaged_users", "page_views", "session_seconds")),
                rng.choice(tuple(CHART_WORDS)),
            )
            rows.append(row(
                f"Make a {CHART_WORDS[chart]} of daily {metric.replace('_', ' ')} from {start:%B} {start.day} to "
                f"{end:%B} {end.day} ({start.isoformat()} to {end.isoformat()}).",
                [call("analytics_create_plot", start_date=start.isoformat(), end_date=end.isoformat(), metric=metric,
                      chart=chart)],
                area,
            ))  # fmt: skip
    return rows


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for item in rows:
            out.write(json.dumps(item) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-dir", type=Path, default=WORLD_DIR)
    parser.add_argument("--examples", type=Path, default=Path(__file__).parent / "data" / "example.jsonl")
    args = parser.parse_args(argv)
    rng = random.Random(SEED)
    world = build_world(rng)
    for table, records in world.items():
        write_table(args.world_dir / f"{table}.csv", records)
    examples = build_examples(rng, world)
    _write_rows(args.examples, examples)
    taken = {
        value
        for example in examples
        for truth in example["ground_truth"]
        for key, value in json.loads(truth["arguments"]).items()
        if key in ("task_id", "customer_id")
    }
    split = build_split_tasks(random.Random(SPLIT_SEED), world, TRAIN_ROWS + VALIDATION_ROWS, taken)
    _write_rows(args.examples.with_name("train.jsonl"), split[:TRAIN_ROWS])
    _write_rows(args.examples.with_name("validation.jsonl"), split[TRAIN_ROWS:])


if __name__ == "__main__":
    main()
