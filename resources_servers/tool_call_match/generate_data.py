"""Write tool_call_match's example rows: small function-calling tasks with their expected calls.

The tools and requests are invented for this project. Each task is declared once below (request, tools it offers,
expected calls, whether order matters); ``python resources_servers/tool_call_match/generate_data.py`` rewrites
``data/example.jsonl`` from them. The five rows cover one call with numbers, parallel calls (any order), a sequence
(order matters), a nested-object argument, and a request that needs no call at all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You are an assistant that acts by calling functions. When the request needs functions, call them with "
    "arguments taken from the request; make every call the request needs and no others. When no function fits, "
    "answer in plain text."
)


def tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": False},
        "strict": False,
    }


CONVERT_UNITS = tool(
    "convert_units",
    "Convert a quantity from one unit to another.",
    {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
    ["value", "from_unit", "to_unit"],
)
GET_FORECAST = tool(
    "get_forecast",
    "Weather forecast for a city.",
    {
        "city": {"type": "string"},
        "days": {"type": "integer", "description": "How many days ahead (default 1)."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    ["city"],
)
CREATE_FOLDER = tool("create_folder", "Create a folder.", {"path": {"type": "string"}}, ["path"])
MOVE_FILE = tool(
    "move_file",
    "Move a file to a new path.",
    {"source": {"type": "string"}, "destination": {"type": "string"}},
    ["source", "destination"],
)
BOOK_TABLE = tool(
    "book_table",
    "Reserve a restaurant table.",
    {
        "restaurant": {"type": "string"},
        "party_size": {"type": "integer"},
        "slot": {
            "type": "object",
            "properties": {"date": {"type": "string", "description": "YYYY-MM-DD"}, "time": {"type": "string"}},
            "required": ["date", "time"],
        },
        "notes": {"type": "string"},
    },
    ["restaurant", "party_size", "slot"],
)

TASKS: list[dict[str, Any]] = [
    {
        "request": "How many kilometres is 12.5 miles?",
        "tools": [CONVERT_UNITS, GET_FORECAST],
        "expected_calls": [
            {"name": "convert_units", "arguments": {"value": 12.5, "from_unit": "mile", "to_unit": "kilometer"}}
        ],
    },
    {
        "request": "Give me tomorrow's forecast for Lisbon and for Porto, in celsius.",
        "tools": [GET_FORECAST, CONVERT_UNITS],
        "expected_calls": [
            {"name": "get_forecast", "arguments": {"city": "Lisbon", "unit": "celsius"}},
            {"name": "get_forecast", "arguments": {"city": "Porto", "unit": "celsius"}},
        ],
    },
    {
        "request": "Make a folder called reports, then move q3.pdf into it.",
        "tools": [CREATE_FOLDER, MOVE_FILE],
        "expected_calls": [
            {"name": "create_folder", "arguments": {"path": "reports"}},
            {"name": "move_file", "arguments": {"source": "q3.pdf", "destination": "reports/q3.pdf"}},
        ],
        "ordered": True,
    },
    {
        "request": "Book a table for 4 at Verde on 2024-05-03 at 19:30, and ask for a window seat.",
        "tools": [BOOK_TABLE],
        "expected_calls": [
            {
                "name": "book_table",
                "arguments": {
                    "restaurant": "Verde",
                    "party_size": 4,
                    "slot": {"date": "2024-05-03", "time": "19:30"},
                    "notes": "window seat",
                },
            }
        ],
    },
    {
        "request": "Thanks, that is all for today!",
        "tools": [GET_FORECAST, BOOK_TABLE],
        "expected_calls": [],
    },
]


def build_row(task: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["request"]}],
            "tools": task["tools"],
        },
        "expected_calls": task["expected_calls"],
    }
    if "ordered" in task:
        row["ordered"] = task["ordered"]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "data" / "example.jsonl")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", encoding="utf-8") as out:
        for task in TASKS:
            out.write(json.dumps(build_row(task)) + "\n")


if __name__ == "__main__":
    main()
