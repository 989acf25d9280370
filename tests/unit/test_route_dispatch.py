"""ExactRouteDispatch (nemo_gym/transport/routes.py): a fixed path of a BodyRoute skips the router, same answers."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel

from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.errors import TransportError
from nemo_gym.observability.correlation import RolloutContextMiddleware, current_rollout_id
from nemo_gym.server_utils import ServerClient, SimpleServer
from nemo_gym.transport.routes import ExactRouteDispatch, ServerApp

COOKIE_NAME = "Server___srv"
COOKIE = f"{COOKIE_NAME}=0123456789abcdef0123456789abcdef".encode()


class Item(BaseModel):
    name: str
    count: int = 0


class Server(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.add_middleware(RolloutContextMiddleware)

        @app.get("/{name}/shadowed")  # comes first: the router takes it for /x/shadowed
        async def by_name(name: str) -> dict[str, str]:
            return {"by_name": name}

        @app.post("/item")
        async def item(body: Item, request: Request, response: Response) -> dict[str, Any]:
            response.set_cookie("seen", "yes")
            return {
                "name": body.name,
                "rollout": current_rollout_id(),
                "route": request.scope["route"].path,
                "endpoint": request.scope["endpoint"].__name__,
                "path_params": request.scope["path_params"],
            }

        @app.get("/x/shadowed")
        async def shadowed() -> dict[str, str]:
            return {"shadowed": "never"}

        @app.post("/upstream_failed")
        async def upstream_failed(body: Item) -> dict[str, str]:
            raise TransportError("the model went away")

        @app.post("/crash")
        async def crash(body: Item) -> dict[str, str]:
            raise ValueError("boom " + "x" * 500)

        @app.post("/http_error")
        async def http_error(body: Item) -> dict[str, str]:
            raise HTTPException(status_code=409, detail="taken", headers={"x-why": "taken"})

        @app.post("/plain_text")
        async def plain_text(body: Item) -> Response:
            return PlainTextResponse(body.name, status_code=202)

        @app.post("/stream")
        async def stream(body: Item) -> Response:
            async def chunks() -> Any:
                yield b"a"
                yield body.name.encode()

            return StreamingResponse(chunks(), media_type="text/plain")

        @app.post("/stream_fails")
        async def stream_fails(body: Item) -> Response:
            async def chunks() -> Any:
                yield b"a"
                raise TransportError("cut off")

            return StreamingResponse(chunks(), media_type="text/plain")

        return app


def _server() -> Server:
    config = BaseRunServerInstanceConfig(name="srv", host="127.0.0.1", port=0, entrypoint="app.py")
    return Server(config=config, server_client=MagicMock(spec=ServerClient))


def _app(dispatch: bool) -> Any:
    app = _server().setup_webserver()
    assert isinstance(app, ServerApp)
    app.exact_dispatch = dispatch
    return app


async def _call(
    app: Any, method: str, path: str, body: bytes = b"", headers: list[Any] | None = None, send_fails: bool = False
) -> list[Any]:
    """Every message the app sends for one request, and the exception it raised, if any; ``send_fails``: the
    server's send raises (an error the app has a handler for) once the answer has started."""
    sent: list[Any] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if send_fails and message["type"] == "http.response.body":
            raise TransportError("the connection broke")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"cookie", COOKIE), *(headers or [])],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
    }
    try:
        await app(scope, receive, send)
    except Exception as error:
        sent.append(("raised", type(error).__name__, str(error)[:80]))
    return sent


JSON = [(b"content-type", b"application/json")]
REQUESTS: list[tuple[str, str, bytes, list[Any]]] = [
    ("POST", "/item", b'{"name": "a"}', JSON),
    ("POST", "/ng-rollout/r-1/item", b'{"name": "a"}', JSON),
    ("POST", "/item", b'{"name": 3}', JSON),
    ("POST", "/item", b'{"name": ', JSON),
    ("POST", "/item", b"", JSON),
    ("POST", "/item", b'{"name": "a"}', []),
    ("POST", "/item", b'{"name": "a"}', [(b"content-type", b"text/plain")]),
    ("GET", "/item", b"", []),
    ("HEAD", "/", b"", []),
    ("GET", "/", b"", []),
    ("POST", "/", b"", []),
    ("GET", "/x/shadowed", b"", []),
    ("GET", "/nowhere", b"", []),
    ("POST", "/item/", b'{"name": "a"}', JSON),
    ("POST", "/upstream_failed", b'{"name": "a"}', JSON),
    ("POST", "/crash", b'{"name": "a"}', JSON),
    ("POST", "/http_error", b'{"name": "a"}', JSON),
    ("POST", "/plain_text", b'{"name": "a"}', JSON),
    ("POST", "/stream", b'{"name": "a"}', JSON),
    ("POST", "/stream_fails", b'{"name": "a"}', JSON),
]


@pytest.mark.parametrize(("method", "path", "body", "headers"), REQUESTS)
def test_the_dispatch_answers_byte_for_byte_as_the_router(
    method: str, path: str, body: bytes, headers: list[Any]
) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        return (
            await _call(_app(True), method, path, body, headers),
            await _call(_app(False), method, path, body, headers),
        )

    fast, general = asyncio.run(asyncio.wait_for(both(), 30))
    assert fast == general
    assert any(isinstance(m, dict) and m.get("type") == "http.response.start" for m in fast) or fast[-1][0] == "raised"


@pytest.mark.parametrize("path", ["/item", "/plain_text", "/stream", "/crash"])
def test_an_error_after_the_answer_started_is_raised_as_the_router_raises_it(path: str) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        return (
            await _call(_app(True), "POST", path, b'{"name": "a"}', JSON, send_fails=True),
            await _call(_app(False), "POST", path, b'{"name": "a"}', JSON, send_fails=True),
        )

    fast, general = asyncio.run(asyncio.wait_for(both(), 30))
    assert fast == general
    assert fast[-1][0] == "raised"


def test_fixed_paths_of_body_routes_skip_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastapi.routing

    app = _app(True)

    async def run() -> list[Any]:
        await _call(app, "GET", "/")  # builds the stack and the table
        monkeypatch.setattr(fastapi.routing.APIRouter, "app", _refuse)
        return await _call(app, "POST", "/item", b'{"name": "a"}', JSON)

    sent = asyncio.run(asyncio.wait_for(run(), 30))
    assert sent[0]["status"] == 200
    dispatch = _find_dispatch(app.middleware_stack)
    assert ("POST", "/item") in dispatch._table
    assert ("GET", "/x/shadowed") not in dispatch._table  # the router would pick /{name}/shadowed
    assert ("GET", "/docs") not in dispatch._table  # not a BodyRoute: the router's


def test_a_route_added_after_the_first_request_is_served_and_can_shadow() -> None:
    app = _app(True)

    async def run() -> tuple[list[Any], list[Any]]:
        await _call(app, "GET", "/")
        app.router.routes.insert(0, app.router.routes.pop())  # /stream_fails first: nothing changes for /item

        @app.post("/late")
        async def late(body: Item) -> dict[str, str]:
            return {"late": body.name}

        return (await _call(app, "POST", "/late", b'{"name": "b"}', JSON), await _call(app, "GET", "/"))

    late, health = asyncio.run(asyncio.wait_for(run(), 30))
    assert (late[0]["status"], late[1]["body"]) == (200, b'{"late":"b"}')
    assert health[1]["body"] == b'{"status":"ok"}'
    assert ("POST", "/late") in _find_dispatch(app.middleware_stack)._table


async def _refuse(*args: Any) -> None:
    raise AssertionError("the router ran")


def _find_dispatch(layer: Any) -> ExactRouteDispatch:
    while not isinstance(layer, ExactRouteDispatch):
        layer = getattr(layer, "app", None) or layer._app
    return layer


@pytest.mark.parametrize(
    "messages",
    [
        [b'{"name": ', b'"a", "count": 2}'],
        [b'{"name": "a", ', b"", b'"count": 2}'],
        [b'{"name": ', None],  # the client hung up halfway
        [None],
    ],
)
def test_a_body_in_pieces_or_cut_short_reads_as_fastapi_reads_it(messages: list[bytes | None]) -> None:
    from fastapi.routing import APIRoute

    from nemo_gym.transport.routes import BodyRoute
    from tests.unit.test_body_route import _app as body_app

    async def call(app: Any) -> list[Any]:
        pending = [
            {"type": "http.disconnect"}
            if chunk is None
            else {"type": "http.request", "body": chunk, "more_body": i < len(messages) - 1}
            for i, chunk in enumerate(messages)
        ]

        async def receive() -> dict[str, Any]:
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        sent: list[Any] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/plain",
            "raw_path": b"/plain",
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json")],
        }
        try:
            await app(scope, receive, send)
        except Exception as error:
            sent.append(("raised", type(error).__name__))
        return sent

    async def both() -> tuple[list[Any], list[Any]]:
        return await call(body_app(BodyRoute)), await call(body_app(APIRoute))

    fast, general = asyncio.run(asyncio.wait_for(both(), 30))
    assert fast == general
    assert fast[0]["status"] == (200 if messages[-1] is not None else 400)  # 400: FastAPI on a body cut short


def test_a_route_replaced_in_place_is_served_and_a_mount_in_front_is_respected() -> None:
    from starlette.routing import Mount

    app = _app(True)

    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        await _call(app, "GET", "/")
        routes = app.router.routes
        index = next(i for i, route in enumerate(routes) if getattr(route, "path", None) == "/item")

        @app.post("/replacement")
        async def replacement(body: Item) -> dict[str, str]:
            return {"replaced": body.name}

        replacement_route = routes.pop()
        replacement_route.path = "/item"  # as a server that swaps its own route in: same length, same list
        replacement_route.path_regex = routes[index].path_regex
        routes[index] = replacement_route
        swapped = await _call(app, "POST", "/item", b'{"name": "a"}', JSON)
        routes.insert(0, Mount("/plain_text", app=_plain_app))  # only below /plain_text/: the route keeps its path
        kept = await _call(app, "POST", "/plain_text", b'{"name": "b"}', JSON)
        routes.insert(0, Mount("", app=_plain_app))  # every path: the router gives everything to it
        return swapped, kept, await _call(app, "POST", "/plain_text", b'{"name": "b"}', JSON)

    swapped, kept, mounted = asyncio.run(asyncio.wait_for(run(), 30))
    assert swapped[1]["body"] == b'{"replaced":"a"}'
    assert kept[1]["body"] == b"b"
    assert mounted[1]["body"] == b"mounted"
    assert _find_dispatch(app.middleware_stack)._table == {}


async def _plain_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"mounted"})
