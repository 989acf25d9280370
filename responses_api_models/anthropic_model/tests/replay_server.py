"""A loopback stand-in for Anthropic's Messages API that replays recorded exchanges, run as its own process.

Each fixture file in ``fixtures/`` is one exchange: the request as it went over the wire (method, path, the headers
that matter, the JSON body; the API key is checked apart: SDK releases send it as ``x-api-key`` or as a
bearer token) and the answer (status, headers, and a JSON ``body`` or the SSE ``events`` of a stream).
An incoming request is answered with the fixture whose request it equals exactly; anything else fails loudly: a 400
``invalid_request_error`` (which the SDK does not retry) naming the closest fixture and the first difference, the
same line on stderr, and an entry in ``GET /_replay/report``, which a test reads to prove every call matched.

    python replay_server.py FIXTURE_DIR --api-key KEY     # prints "replay listening on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPORT_PATH = "/_replay/report"


def load_fixtures(folder: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def first_difference(expected: Any, got: Any, where: str = "body") -> str | None:
    """Where two JSON values first differ, as ``path: expected X, got Y``; None when equal."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            if key not in got:
                return f"{where}.{key}: missing (expected {json.dumps(expected[key])[:200]})"
            if key not in expected:
                return f"{where}.{key}: not in the recording (got {json.dumps(got[key])[:200]})"
            found = first_difference(expected[key], got[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return f"{where}: {len(expected)} entries recorded, got {len(got)}"
        for index, (a, b) in enumerate(zip(expected, got, strict=True)):
            found = first_difference(a, b, f"{where}[{index}]")
            if found:
                return found
        return None
    if expected != got or type(expected) is not type(got):
        return f"{where}: expected {json.dumps(expected)[:200]}, got {json.dumps(got)[:200]}"
    return None


class Replay:
    def __init__(self, fixtures: dict[str, dict[str, Any]], api_key: str) -> None:
        self.fixtures, self.api_key = fixtures, api_key
        self.served: dict[str, int] = {}
        self.mismatches: list[str] = []
        self.lock = threading.Lock()

    def match(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[str | None, str]:
        """(fixture name, "") for a match, else (None, why)."""
        if self.api_key not in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")):
            return None, "the API key (x-api-key, or Authorization: Bearer) is not the one the replay was started with"
        closest: tuple[int, str] = (-1, "no fixtures")
        for name, fixture in self.fixtures.items():
            recorded = fixture["request"]
            if (recorded["method"], recorded["path"]) != (method, path):
                continue
            wrong_header = next((k for k, v in recorded.get("headers", {}).items() if headers.get(k) != v), None)
            difference = first_difference(recorded["body"], body)
            if wrong_header is None and difference is None:
                return name, ""
            why = difference
            if wrong_header:
                why = f"header {wrong_header}: expected {recorded['headers'][wrong_header]!r}, got {headers.get(wrong_header)!r}"
            depth = 0 if wrong_header else len(str(difference).split(":")[0])
            closest = max(closest, (depth, f"closest fixture {name!r} differs at {why}"))
        return None, closest[1]


class Handler(BaseHTTPRequestHandler):
    replay: Replay

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != REPORT_PATH:
            self._send(404, {}, b"")
            return
        with self.replay.lock:
            report = {"served": self.replay.served, "mismatches": self.replay.mismatches}
        self._send(200, {"content-type": "application/json"}, json.dumps(report).encode())

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {key.lower(): value for key, value in self.headers.items()}
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            body = raw.decode(errors="replace")
        name, why = self.replay.match("POST", self.path, headers, body)
        if name is None:
            line = f"replay mismatch: POST {self.path}: {why}"
            print(line, file=sys.stderr, flush=True)
            with self.replay.lock:
                self.replay.mismatches.append(line)
            error = {"type": "error", "error": {"type": "invalid_request_error", "message": line}}
            self._send(400, {"content-type": "application/json"}, json.dumps(error).encode())
            return
        with self.replay.lock:
            self.replay.served[name] = self.replay.served.get(name, 0) + 1
        answer = self.replay.fixtures[name]["response"]
        if "events" in answer:
            data = "".join(f"event: {e['event']}\ndata: {json.dumps(e['data'])}\n\n" for e in answer["events"])
            self._send(answer["status"], answer["headers"], data.encode())
        else:
            self._send(answer["status"], answer["headers"], json.dumps(answer["body"]).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", type=Path)
    parser.add_argument("--api-key", required=True)
    args = parser.parse_args()
    Handler.replay = Replay(load_fixtures(args.fixtures), args.api_key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"replay listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
