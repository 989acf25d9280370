"""BodyRoute (nemo_gym/transport/routes.py) answers exactly as FastAPI's own route does, good bodies and bad."""

from __future__ import annotations

import datetime
import decimal
import json
from enum import Enum
from typing import Any

import pytest
from fastapi import Body, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.transport import routes
from nemo_gym.transport.routes import BodyRoute, _plan
from tests.helpers import app_with_routes


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    count: int = Field(ge=0)
    ratio: float = 1.0
    tags: list[str] = []


class Color(Enum):
    RED = "red"


class StrictItem(BaseModel):
    model_config = ConfigDict(strict=True)

    color: Color
    when: datetime.date
    pair: tuple[int, int]


class Teapot(Exception):
    pass


class Price(BaseModel):
    amount: decimal.Decimal


class Answer(BaseModel):
    name: str
    total: int


class AnswerPlus(Answer):
    extra: str = "kept out of an Answer's dump"


class Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    value: int = Field(alias="theValue")
    note: str | None = None


def _app(route_class: type[APIRoute]) -> FastAPI:
    """The same routes on FastAPI's own app and routes, or on ours (``ServerApp``, telemetry off, ``BodyRoute``)."""
    app = app_with_routes(route_class)

    @app.post("/plain")
    async def plain(body: Item) -> Answer:
        return Answer(name=body.name, total=body.count + len(body.tags))

    @app.post("/dict_answer")
    async def dict_answer(body: Item) -> Answer:
        return {"name": body.name, "total": body.count, "ignored": True}  # type: ignore[return-value]

    @app.post("/bad_answer")
    async def bad_answer(body: Item) -> Answer:
        return {"name": body.name}  # type: ignore[return-value]

    @app.post("/untyped")
    async def untyped(body: Item):  # type: ignore[no-untyped-def]
        return {"ratio": body.ratio, "tags": body.tags}

    @app.post("/subclass")
    async def subclass(body: Item) -> Answer:
        return AnswerPlus(name=body.name, total=body.count)

    @app.post("/aliased")
    async def aliased(body: Item) -> Aliased:
        return Aliased(value=body.count)

    @app.post("/not_by_alias", response_model_by_alias=False)
    async def not_by_alias(body: Item) -> Aliased:
        return Aliased(value=body.count)

    @app.post("/exclude_none", response_model_exclude_none=True)
    async def exclude_none(body: Item) -> Aliased:
        return Aliased(value=body.count)

    @app.post("/with_request")
    async def with_request(request: Request, response: Response, body: Item) -> Answer:
        response.set_cookie("seen", request.cookies.get("seen", "no"))
        response.status_code = 201
        return Answer(name=body.name, total=body.count)

    @app.post("/status", status_code=202)
    async def status(body: Item) -> Answer:
        return Answer(name=body.name, total=0)

    @app.post("/raw")
    async def raw(body: Item) -> Response:
        return Response(content=body.name.encode(), media_type="text/plain", headers={"x-raw": "1"})

    @app.post("/explicit_body")
    async def explicit_body(body: Item = Body(...)) -> Answer:
        return Answer(name=body.name, total=body.count)

    @app.post("/no_body")
    async def no_body(request: Request) -> Response:
        raw = await request.body()
        return Response(content=raw[::-1], media_type="application/json", status_code=207)

    @app.post("/nothing")
    async def nothing() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/fails")
    async def fails(body: Item) -> Answer:
        raise HTTPException(status_code=409, detail=f"taken: {body.name}")

    @app.post("/strict")
    async def strict(body: StrictItem) -> dict[str, str]:
        return {"color": body.color.value}

    @app.post("/price")
    async def price(body: Price) -> dict[str, str]:
        return {"amount": str(body.amount)}

    @app.post("/teapot")
    async def teapot(body: Item) -> Answer:
        raise Teapot(body.name)

    @app.post("/crash")
    async def crash(body: Item) -> Answer:
        raise RuntimeError(body.name)

    @app.exception_handler(Teapot)
    async def _teapot(request: Request, error: Teapot) -> JSONResponse:
        return JSONResponse(status_code=418, content={"teapot": str(error), "path": request.url.path})

    @app.post("/with_query")
    async def with_query(body: Item, scale: int = 1) -> Answer:
        return Answer(name=body.name, total=body.count * scale)

    @app.post("/sync")
    def sync(body: Item) -> Answer:
        return Answer(name=body.name, total=body.count)

    return app


BODIES: list[tuple[str, bytes, str | None]] = [
    ("good", b'{"name": "a", "count": 2, "tags": ["x"]}', "application/json"),
    ("good, charset", b'{"name": "a", "count": 2}', "application/json; charset=utf-8"),
    ("good, upper case type", b'{"name": "a", "count": 2}', "Application/JSON"),
    ("missing field", b'{"name": "a"}', "application/json"),
    ("wrong type", b'{"name": 3, "count": "x"}', "application/json"),
    ("constraint", b'{"name": "a", "count": -1}', "application/json"),
    ("extra field", b'{"name": "a", "count": 1, "other": 1}', "application/json"),
    ("not json", b'{"name": "a", "count": ', "application/json"),
    ("not an object", b"[1, 2]", "application/json"),
    ("NaN (Python's parser takes it)", b'{"name": "a", "count": 1, "ratio": NaN}', "application/json"),
    ("empty", b"", "application/json"),
    ("no content type", b'{"name": "a", "count": 1}', None),
    ("text", b'{"name": "a", "count": 1}', "text/plain"),
    ("lone surrogate", b'{"name": "\\ud800", "count": 1}', "application/json"),
    ("int as float", b'{"name": "a", "count": 1.0, "ratio": 2}', "application/json"),
]
PATHS = [
    "/plain",
    "/dict_answer",
    "/bad_answer",
    "/untyped",
    "/subclass",
    "/aliased",
    "/not_by_alias",
    "/exclude_none",
    "/with_request",
    "/status",
    "/raw",
    "/explicit_body",
    "/no_body",
    "/nothing",
    "/fails",
    "/teapot",
    "/crash",
    "/with_query?scale=3",
    "/sync",
]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/strict", b'{"color": "red", "when": "2026-01-02", "pair": [1, 2]}'),
        ("/price", b'{"amount": 1.00000000000000000001}'),
    ],
)
def test_json_only_a_python_parse_would_refuse_or_round_answers_as_fastapi(
    clients: Any, path: str, body: bytes
) -> None:
    general, fast = (
        client.post(path, content=body, headers={"content-type": "application/json"}) for client in clients
    )
    assert (fast.status_code, fast.content) == (general.status_code, general.content)


@pytest.fixture(scope="module")
def clients() -> Any:
    with (
        TestClient(_app(APIRoute), raise_server_exceptions=False) as general,
        TestClient(_app(BodyRoute), raise_server_exceptions=False) as fast,
    ):
        yield general, fast


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("case", "body", "content_type"), BODIES, ids=[case for case, _, _ in BODIES])
def test_same_answer_as_fastapi(clients: Any, path: str, case: str, body: bytes, content_type: str | None) -> None:
    headers = {"content-type": content_type, "cookie": "seen=yes"} if content_type else {"cookie": "seen=yes"}
    answers = [client.post(path, content=body, headers=headers) for client in clients]
    general, fast = answers
    assert (fast.status_code, fast.content) == (general.status_code, general.content), case
    assert sorted(fast.headers.items()) == sorted(general.headers.items()), case


def test_the_common_shapes_take_the_fast_path() -> None:
    routes = {route.path: route for route in _app(BodyRoute).routes if isinstance(route, APIRoute)}
    fast = {path for path, route in routes.items() if _plan(route) is not None}
    assert fast == {
        "/plain",
        "/dict_answer",
        "/bad_answer",
        "/untyped",
        "/subclass",
        "/aliased",
        "/not_by_alias",
        "/exclude_none",
        "/with_request",
        "/status",
        "/raw",
        "/explicit_body",
        "/no_body",
        "/nothing",
        "/fails",
        "/teapot",
        "/crash",
    }


def test_a_good_body_never_reaches_fastapis_dependency_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastapi.routing

    async def refuse(**kwargs: Any) -> Any:
        raise AssertionError("the general path ran")

    with TestClient(_app(BodyRoute)) as client:
        monkeypatch.setattr(fastapi.routing, "solve_dependencies", refuse)
        answer = client.post("/with_request", json={"name": "a", "count": 2})
        assert (answer.status_code, answer.json()) == (201, {"name": "a", "total": 2})
        assert answer.cookies["seen"] == "no"
        assert client.post("/nothing").json() == {"status": "ok"}
        assert client.post("/no_body", content=b"[1,2]").content == b"]2,1["


def test_a_typed_answer_is_dumped_without_fastapis_layers_and_a_bad_one_by_fastapi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A valid answer of a route with default dump options is validated and dumped by the response field's own
    validator and serializer (the calls ``serialize_response`` makes); anything else still goes through it."""
    calls: list[str] = []
    serialize = routes.serialize_response

    async def counted(**kwargs: Any) -> Any:
        calls.append(kwargs["endpoint_ctx"]["path"])
        return await serialize(**kwargs)

    monkeypatch.setattr(routes, "serialize_response", counted)
    with TestClient(_app(BodyRoute), raise_server_exceptions=False) as client:
        good = {"name": "a", "count": 2}
        for path in ("/plain", "/dict_answer", "/subclass", "/aliased", "/with_request", "/status", "/nothing"):
            assert client.post(path, json=good).status_code < 300, path
        assert calls == []
        assert client.post("/bad_answer", json=good).status_code == 500
        assert client.post("/exclude_none", json=good).json() == {"theValue": 2}
        assert client.post("/not_by_alias", json=good).json() == {"value": 2, "note": None}
        assert calls == ["POST /bad_answer", "POST /exclude_none", "POST /not_by_alias"]


@pytest.mark.parametrize("path", ["/plain", "/with_request", "/strict", "/price"])
@pytest.mark.parametrize(("case", "body", "content_type"), BODIES, ids=[case for case, _, _ in BODIES])
def test_the_large_body_parse_answers_as_fastapi(
    clients: Any, monkeypatch: pytest.MonkeyPatch, path: str, case: str, body: bytes, content_type: str | None
) -> None:
    """Every body, good and bad, parsed as a large one is (``from_json`` then ``model_validate``)."""
    monkeypatch.setattr(routes, "LARGE_BODY_BYTES", 0)
    headers = {"content-type": content_type, "cookie": "seen=yes"} if content_type else {"cookie": "seen=yes"}
    general, fast = (client.post(path, content=body, headers=headers) for client in clients)
    assert (fast.status_code, fast.content) == (general.status_code, general.content), case


class Rows(BaseModel):
    rows: list[dict[str, Any]]
    label: str = ""


def test_a_large_body_gives_the_same_model_either_way() -> None:
    row = {"reward": 1.0, "_ng_task_index": 3, "agent_ref": {"name": "agent"}, "big": 2**70, "text": "é\u2028"}
    raw = json.dumps({"rows": [row | {"i": i} for i in range(5000)], "label": "x"}, separators=(",", ":")).encode()
    assert len(raw) >= routes.LARGE_BODY_BYTES
    parsed = routes._validate_body(Rows, raw)
    assert parsed == Rows.model_validate_json(raw) == Rows.model_validate(json.loads(raw))
    assert parsed.rows[4999] == row | {"i": 4999}
    with pytest.raises(ValueError):
        routes._validate_body(Rows, raw[:-1])
    with pytest.raises(ValueError):
        routes._validate_body(Rows, raw.replace(b'"label":"x"', b'"label":7'))
