"""The FastAPI app and route class of our servers: the common case skips FastAPI's general path, with the same answers.

Nearly every route of our servers (and of NeMo Gym environments) is ``async def handler(self, body: SomeModel)``,
perhaps with the ``Request`` or ``Response`` as well. FastAPI's general path for it decodes the body with the stdlib
``json`` module, solves a dependency graph of one node, validates the resulting dict, and builds a throwaway
sub-response; in a busy resources server that was about a quarter of the CPU of a request. :class:`BodyRoute` plans
once, when the route is built, whether the endpoint has that shape, and then parses the raw body in one
``model_validate_json`` call and calls the endpoint directly. The answer is validated and dumped by the response
field's own validator and serializer, with the arguments FastAPI's ``serialize_response`` gives them (any other dump
option, and every answer that fails validation, go through ``serialize_response`` itself), so response JSON is byte
for byte what FastAPI sends.

Whenever the fast path is unsure it hands the request to FastAPI's general handler, which then does exactly what it
always did: a body that is empty, not ``application/json``, or not valid for the model (so every 422 is FastAPI's
own, with FastAPI's locations and messages), and any route of another shape (query or path parameters,
dependencies, forms, streams, background tasks, an older FastAPI without the names used here).

:class:`ServerApp` is the app these routes live in: FastAPI's, less the layers that do nothing for our servers, and
with :class:`ExactRouteDispatch` just under FastAPI's exception layer: a request for a fixed path of a ``BodyRoute``
goes straight to it from a ``(method, path)`` table, with the same exception handling; routing over every route
(with a regex each) and four layers of frames were a fifth of a small request's CPU.

Only public names of FastAPI and Starlette are used (issue 36): where the general path needs something they keep to
themselves, the route takes the general path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response, params
from fastapi.datastructures import DefaultPlaceholder
from fastapi.routing import APIRoute
from fastapi.utils import is_body_allowed_for_status_code
from pydantic import BaseModel, TypeAdapter
from pydantic_core import SchemaSerializer, SchemaValidator, ValidationError, from_json
from starlette.background import BackgroundTask
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import Match, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.transport import heap

try:  # public names of the FastAPI this was written against; without them every route takes the general path
    from fastapi.routing import serialize_response
    from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
except ImportError:  # pragma: no cover - older FastAPI / Starlette
    serialize_response = None  # type: ignore[assignment]

__all__ = ["BodyRoute", "ExactRouteDispatch", "ServerApp"]

_Handler = Callable[[Request], Coroutine[Any, Any, Response]]
_Fast = Callable[[Request], Coroutine[Any, Any, Response | None]]
_JSON = b"application/json"


class BodyRoute(APIRoute):
    """An ``APIRoute`` that serves ``handler(body: Model[, request][, response])`` (or ``handler([request][,
    response])``, no body) without FastAPI's general path.

    Set it as ``app.router.route_class`` before adding routes (``SimpleServer.create_app`` does).
    """

    passthrough: Callable[[bytes], Coroutine[Any, Any, Response | None]] | None = None
    """Tried with a JSON body's bytes before they are validated: its response is the answer, and None sends the
    request on to the typed endpoint as if it had not been asked (an agent's ``/aggregate_metrics`` passes a run's
    rows on this way, unparsed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._fast: tuple[_Fast, _Handler] | None = None
        self._fast_app: ASGIApp | None = None
        super().__init__(*args, **kwargs)
        # Planned here, on this route's own settings, and served as this route's app. A router that includes this
        # one builds its own handler from ``get_route_handler``, FastAPI's as it is, with the settings it adds.
        plan = _plan(self) if getattr(self, "max_body_size", None) is None else None
        if plan is not None:
            self._fast = (_fast_handler(self, plan), self.get_route_handler())
            self.app = self._fast_app = _route_app(*self._fast)


class ServerApp(FastAPI):
    """A FastAPI app whose middleware stack leaves out the two layers FastAPI adds that do nothing for our servers.

    ``ExceptionTelemetryMiddleware`` records exceptions for FastAPI's native telemetry, which our servers turn off
    (``telemetry=``), and ``AppBodyLimitMiddleware`` without a ``max_body_size`` only hands a request on (our
    ``AccessMiddleware`` bounds bodies). Each was a coroutine frame on the way in and out of every request, as is
    ``Starlette.__call__`` under ``FastAPI.__call__``: with telemetry off, a request goes straight to the stack.
    A request for a fixed path of a ``BodyRoute`` skips the router (:class:`ExactRouteDispatch`) unless
    ``exact_dispatch`` is set false before the first request.
    """

    exact_dispatch: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # FastAPI turns each signal on unless the ``telemetry=`` argument turns it off.
        telemetry = kwargs.get("telemetry") or {}
        self._telemetry_off = not any(telemetry.get(k, True) for k in ("tracing", "metrics", "logs"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # What FastAPI.__call__ and Starlette.__call__ do for a request when telemetry is off, in one frame.
        if scope["type"] == "http" and self._telemetry_off and not self.root_path and self.middleware_stack is not None:
            scope["app"] = self
            await self.middleware_stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> Any:
        stack = super().build_middleware_stack()
        node: Any = stack
        while (found := _inner_app(node)) is not None:
            attribute, child = found
            if (self._telemetry_off and type(child).__name__ == "ExceptionTelemetryMiddleware") or (
                type(child).__name__ == "AppBodyLimitMiddleware" and getattr(self, "max_body_size", 0) is None
            ):
                setattr(node, attribute, child.app)  # unlink it: its inner app is the next layer as it stands
            elif type(child) is ExceptionMiddleware and serialize_response is not None and self.exact_dispatch:
                child.app = ExactRouteDispatch(child.app, self.router)
                break
            else:
                node = child
        return stack


def _inner_app(layer: Any) -> tuple[str, Any] | None:
    """The attribute of a middleware that holds the next layer, and that layer (``app``, or ``_app`` in ours)."""
    for attribute in ("app", "_app"):
        child = getattr(layer, attribute, None)
        if child is not None and callable(child):
            return attribute, child
    return None


class _Plan:
    __slots__ = ("body_name", "call", "model", "request_name", "response_name")

    def __init__(
        self,
        call: Any,
        body_name: str,
        model: type[BaseModel] | None,
        request_name: str | None,
        response_name: str | None,
    ) -> None:
        self.call = call
        self.body_name = body_name
        self.model = model
        self.request_name = request_name
        self.response_name = response_name


def _plan(route: APIRoute) -> _Plan | None:
    """The endpoint's shape when it is the one the fast path serves, else None."""
    if serialize_response is None:
        return None
    dependant = route.dependant
    call = dependant.call
    if (
        call is None
        or not inspect.iscoroutinefunction(call)
        or inspect.isasyncgenfunction(call)
        or len(dependant.body_params) > 1
        or (route.body_field is None) != (not dependant.body_params)
        or dependant.path_params
        or dependant.query_params
        or dependant.header_params
        or dependant.cookie_params
        or dependant.dependencies
        or dependant.websocket_param_name
        or dependant.http_connection_param_name
        or dependant.background_tasks_param_name
        or dependant.security_scopes_param_name
        or (dependant.body_params and getattr(dependant.body_params[0].field_info, "embed", None))
        or getattr(route, "stream_item_field", None) is not None
        or getattr(route, "is_json_stream", False)
        or getattr(route, "is_sse_stream", False)
    ):
        return None
    if not dependant.body_params:
        return _Plan(call, "", None, dependant.request_param_name, dependant.response_param_name)
    field = dependant.body_params[0]
    info = field.field_info
    model = info.annotation
    if (
        not (isinstance(model, type) and issubclass(model, BaseModel))
        or not info.is_required()
        or info.metadata
        or type(info) is not params.Body  # not Form / File, which subclass it
        or _parses_json_differently(model.__pydantic_core_schema__)
    ):
        return None
    return _Plan(call, field.name, model, dependant.request_param_name, dependant.response_param_name)


def _fast_handler(route: BodyRoute, plan: _Plan) -> _Fast:
    """The fast path of one route: its response, or None where FastAPI's general handler must answer instead."""
    call, model, body_name = plan.call, plan.model, plan.body_name
    request_name, response_name = plan.request_name, plan.response_name
    response_field = route.response_field
    status_code = route.status_code
    response_class = route.response_class
    dump_json = response_field is not None and isinstance(response_class, DefaultPlaceholder)
    actual_class = response_class.value if isinstance(response_class, DefaultPlaceholder) else response_class
    options: dict[str, Any] = {
        "include": route.response_model_include,
        "exclude": route.response_model_exclude,
        "by_alias": route.response_model_by_alias,
        "exclude_unset": route.response_model_exclude_unset,
        "exclude_defaults": route.response_model_exclude_defaults,
        "exclude_none": route.response_model_exclude_none,
    }
    path = route.path
    to_json = _answer_json(response_field, options) if dump_json else None

    async def handler(request: Request) -> Response | None:
        scope = request.scope
        if MAX_BODY_SIZE_SCOPE_KEY in scope:
            return None
        values: dict[str, Any] = {}
        large = False
        if model is not None:
            if not _declares_json(scope["headers"]):
                return None
            try:
                raw = await _read_body(request)
            except HTTPException:
                raise
            except Exception as error:  # as FastAPI's general path answers a body it could not read
                raise HTTPException(status_code=400, detail="There was an error parsing the body") from error
            if not raw:
                return None
            large = len(raw) >= heap.RELEASE_AFTER_BYTES
            passthrough = route.passthrough
            if passthrough is not None:
                passed = await passthrough(raw)
                if passed is not None:
                    if large:
                        passed.background = BackgroundTask(heap.release_after_response)
                    return passed
            try:
                values[body_name] = _validate_body(model, raw)
            except ValueError:  # ValidationError: FastAPI's own 422 (or its answer to JSON only Python's parser takes)
                return None
        sub_response: Response | None = None
        if request_name is not None:
            values[request_name] = request
        if response_name is not None:
            sub_response = Response()
            del sub_response.headers["content-length"]
            sub_response.status_code = None  # type: ignore[assignment]
            values[response_name] = sub_response
        raw_response = await call(**values)
        if isinstance(raw_response, Response):
            return raw_response
        status = sub_response.status_code if sub_response is not None and sub_response.status_code else status_code
        content = to_json(raw_response) if to_json is not None else None
        if content is None:
            endpoint_ctx: Any = _endpoint_context(call)
            endpoint_ctx["path"] = f"{request.method} {scope.get('root_path', '').rstrip('/')}{path}"
            content = await serialize_response(
                field=response_field,
                response_content=raw_response,
                is_coroutine=True,
                endpoint_ctx=endpoint_ctx,
                dump_json=dump_json,
                **options,
            )
        # After a large body's answer is sent, what handling it freed goes back to the system (transport/heap.py).
        background = BackgroundTask(heap.release_after_response) if large else None
        args: dict[str, Any] = {"background": background}
        if status is not None:
            args["status_code"] = status
        if dump_json:
            response = Response(content=content, media_type="application/json", **args)
        else:
            response = actual_class(content, **args)
        if not is_body_allowed_for_status_code(response.status_code):
            response.body = b""
        if sub_response is not None:
            response.headers.raw.extend(sub_response.headers.raw)
        return response

    return handler


def _endpoint_context(call: Any) -> dict[str, Any]:
    """Where the endpoint is (file, line, function), for the message of an answer that fails its response model: what
    FastAPI's general path puts in it, found once per answer that fails (rare) with ``inspect``."""
    context: dict[str, Any] = {}
    try:
        source = inspect.getsourcefile(call)
        if source is not None:
            context["file"] = source
        context["line"] = inspect.getsourcelines(call)[1]
        name = getattr(call, "__name__", None)
        if name is not None:
            context["function"] = name
    except (OSError, TypeError):
        return {}
    return context


def _answer_json(field: Any, options: dict[str, Any]) -> Callable[[Any], bytes | None] | None:
    """What ``serialize_response`` makes of a route's answer, as the two calls into pydantic-core it comes down to.

    For a response model with FastAPI's default dump options, ``serialize_response`` validates the answer with the
    field's ``TypeAdapter`` (``from_attributes=True``) and dumps it with ``by_alias``; its Python layers were a
    tenth of a small answer's cost. The same validator and serializer are called here with the same arguments.
    An answer that fails validation gives None: ``serialize_response`` then raises its own error for it.
    None (no shortcut) for any other route, or where the adapter is not built in the shape this expects.
    """
    if any(options[key] for key in ("include", "exclude", "exclude_unset", "exclude_defaults", "exclude_none")):
        return None
    info = getattr(field, "field_info", None)
    # FastAPI's adapter for a response field made from the return annotation alone (no metadata of its own, as for
    # every route of ours) validates and dumps as one made from the annotation: the same schema.
    if info is None or getattr(info, "metadata", True) or getattr(field, "config", None):
        return None
    try:
        adapter: Any = TypeAdapter(info.annotation)
    except Exception:  # what pydantic cannot adapt on its own: serialize_response answers
        return None
    validator, serializer = getattr(adapter, "validator", None), getattr(adapter, "serializer", None)
    if not isinstance(validator, SchemaValidator) or not isinstance(serializer, SchemaSerializer):
        return None
    by_alias = options["by_alias"]
    if by_alias is not True:  # FastAPI's default; validate_python's by_alias / by_name check is not repeated here
        return None
    validate, dump = validator.validate_python, serializer.to_json

    def to_json(value: Any) -> bytes | None:
        try:
            valid = validate(value, from_attributes=True, allow_partial=False)
        except ValidationError:
            return None
        return dump(valid, by_alias=True, warnings=True)

    return to_json


async def _read_body(request: Request) -> bytes:
    """``await request.body()``; a large body's pieces, joined there, hand their pages back at once."""
    body = await request.body()
    if len(body) >= heap.RELEASE_AFTER_BYTES:
        heap.release_read_pieces()
    return body


LARGE_BODY_BYTES = 256 * 1024
"""From this size on a body is parsed to Python objects first and then validated (see :func:`_validate_body`)."""


def _validate_body(model: type[BaseModel], raw: bytes) -> BaseModel:
    """``model`` from the body: one ``model_validate_json``, or for a large body ``from_json`` then ``model_validate``.

    Both give the model FastAPI's general path gives (it validates what ``json.loads`` makes of the body). The second
    holds much less memory for open-ended content (``dict[str, Any]``, the rows of ``/aggregate_metrics``):
    ``from_json`` shares repeated keys and short strings, which ``model_validate_json`` builds anew for every
    ``Any`` value. The rows of a 65,536-rollout run took ~125 MB one way and ~73 MB the other, in the agent and again
    in the resources server. Small bodies, nearly all of them, keep the one call, which costs less CPU.
    An invalid body raises ``ValidationError`` either way, and JSON ``from_json`` refuses raises ``ValueError``.
    """
    if len(raw) < LARGE_BODY_BYTES:
        return model.model_validate_json(raw)
    return model.model_validate(from_json(raw))


def _parses_json_differently(schema: Any) -> bool:
    """Whether validating JSON with this core schema can differ from validating what ``json.loads`` makes of it.

    FastAPI validates the latter. Strict validation of JSON accepts what strict validation of Python objects refuses
    (an enum, a date or a tuple given as JSON), and a decimal keeps digits that ``json.loads`` rounds to a float, so
    a model with either anywhere takes the general path.
    """
    if isinstance(schema, dict):
        return (
            schema.get("strict") is True
            or schema.get("type") == "decimal"
            or any(_parses_json_differently(value) for value in schema.values())
        )
    if isinstance(schema, (list, tuple)):
        return any(_parses_json_differently(value) for value in schema)
    return False


def _route_app(fast: _Fast, general: _Handler) -> ASGIApp:
    """The route's ASGI app: ``fastapi.routing.request_response`` without its per-request exception wrapper and exit
    stacks. An exception goes on to the app's ``ExceptionMiddleware``, which holds the same handlers; the stacks are
    opened only for the general handler, the one thing that uses them. Every layer here is one more frame that each
    await of a long request (an agent's ``/run``) passes through when it resumes."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        response = await fast(request)
        if response is not None:
            await response(scope, receive, send)
            return
        await _answer_generally(general, request, scope, receive, send)

    return app


async def _answer_generally(general: _Handler, request: Request, scope: Scope, receive: Receive, send: Send) -> None:
    """FastAPI's general path, with the request and function exit stacks it expects in the scope."""
    async with AsyncExitStack() as request_stack:
        scope["fastapi_inner_astack"] = request_stack
        async with AsyncExitStack() as function_stack:
            scope["fastapi_function_astack"] = function_stack
            response = await general(request)
        await response(scope, receive, send)


def _declares_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request says its body is exactly ``application/json`` (anything else: FastAPI decides)."""
    for name, value in headers:
        if name == b"content-type":
            return value == _JSON or value.lower() == _JSON
    return False


class ExactRouteDispatch:
    """Sits just under FastAPI's ``ExceptionMiddleware`` and serves a request for a fixed path of a ``BodyRoute``
    directly: one dict lookup on ``(method, path)`` instead of the router's walk over every route with a regex each,
    and none of the layers between (the exit-stack middleware, the router, the route's ``handle``). Everything else
    goes down the usual stack (``app``) unchanged.

    A ``(method, path)`` is in the table only when the router would pick that same route for it: the first route
    that fully matches it, with only plain routes (fixed regex and methods) before it. An exception goes up to the
    ``ExceptionMiddleware`` above, which handles it with the app's handlers as it handles any route's; FastAPI's
    general path still gets the exit stacks it uses. The table is built again whenever the router's routes change.
    """

    def __init__(self, app: ASGIApp, router: Any) -> None:
        self.app = app
        self._router = router
        self._table: dict[tuple[str, str], tuple[APIRoute, _Fast, _Handler]] = {}
        self._routes: list[Any] | None = None  # the routes the table was built from

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = None
        if scope["type"] == "http" and not scope.get("root_path") and "fastapi.telemetry" not in scope:
            # The same route objects in the same order (an identity check per route).
            if self._router.routes != self._routes:
                self._build()
            hit = self._table.get((scope["method"], scope["path"]))
        if hit is None:
            await self.app(scope, receive, send)
            return
        route, fast, general = hit  # (one frame less for every resumption of a long request: not a method)
        # What the router leaves in the scope on the way to this route.
        if "router" not in scope:
            scope["router"] = self._router
        scope["endpoint"] = route.endpoint
        scope["path_params"] = dict(scope.get("path_params", {}))
        scope["route"] = route
        request = Request(scope, receive, send)
        response = await fast(request)
        if response is None:
            await _general_app(general, request)(scope, receive, send)
        else:
            await response(scope, receive, send)

    def _build(self) -> None:
        router = self._router
        routes = list(router.routes)
        table: dict[tuple[str, str], tuple[APIRoute, _Fast, _Handler]] = {}
        if not getattr(router, "form_limits", None):
            for route in routes:
                fast = getattr(route, "_fast", None)  # a BodyRoute's own, served as its app
                if (
                    fast is None
                    or route.app is not getattr(route, "_fast_app", None)
                    or type(route).handle is not APIRoute.handle
                    or not route.methods
                ):
                    continue
                for method in route.methods:
                    if _first_full_match(routes, method, route.path) is route:
                        table[(method, route.path)] = (route, *fast)
        self._table = table
        self._routes = routes


def _general_app(general: _Handler, request: Request) -> ASGIApp:
    """FastAPI's general path for a request the fast path left, with the exit stacks it expects in the scope."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        async with AsyncExitStack() as middleware_stack:
            scope["fastapi_middleware_astack"] = middleware_stack
            await _answer_generally(general, request, scope, receive, send)

    return app


_STATIC_MATCHES = (Route.matches, APIRoute.matches, Mount.matches)
"""Ways of matching that depend on the method and path alone (a ``Host`` route, say, reads a header)."""


def _first_full_match(routes: list[Any], method: str, path: str) -> Any:
    """The route the router picks for ``method path`` when only plain routes come first (else None: not sure)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in routes:
        if type(route).matches not in _STATIC_MATCHES:
            return None
        if route.matches(scope)[0] is Match.FULL:
            return route
    return None
