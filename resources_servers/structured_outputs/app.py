"""structured_outputs: the model must produce data that conforms to a JSON schema, as text or as a tool call.

Text mode (``response_mode: text``): the payload is the last fenced block tagged with the row's ``schema_type``
(json, yaml, toml, xml or csv; an untagged block counts too), else the whole reply. It is parsed in that format
(``parsing.py``) and validated against the row's schema with ``jsonschema``. Tool-call mode
(``response_mode: tool_call``): the trajectory must hold exactly one function call, named ``tool_name`` when the row
gives one; its arguments (or their ``tool_payload_key`` member) are the payload. The schema comes from the row
(``schema_str`` as JSON text, or ``json_schema`` as an object), or in tool-call mode from the named tool's parameters.

Reward: 1.0 when the payload parses and validates, else 0.0. By default the schema is strictified first (every
listed property required, no extra keys). ``error_type`` and ``error_message`` say what went wrong.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.metrics import aggregate_verify_responses, category_metrics
from nemo_gym.verifiers.answers import assistant_text
from nemo_gym.verifiers.tool_calls import function_calls
from resources_servers.structured_outputs.parsing import PayloadError, SchemaType, extract_payload, parse_payload
from resources_servers.structured_outputs.schemas import check_schema, load_schema, strictify, validation_error

ErrorType = Literal[
    "empty_response", "schema_error", "parse_error", "validation_error", "api_error", "missing_tool_call",
    "multiple_tool_calls", "wrong_tool_name", "tool_arguments_parse_error", "missing_tool_payload_key",
]  # fmt: skip


class StructuredOutputsResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    strict_schema: bool = True
    """Default for rows without ``strict_schema``: require every property and forbid unlisted keys."""
    check_formats: bool = True
    """Check ``format`` keywords (date, email, ipv4 ...) where jsonschema can."""
    xml_coerce_types: bool = True
    """Convert XML and CSV text leaves to the schema's types (off: every leaf is a string)."""


class StructuredOutputsVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    schema_str: str | None = None
    """The schema as JSON text (as most datasets store it)."""
    json_schema: dict[str, Any] | None = None
    """The schema as an object (used when ``schema_str`` is absent)."""
    schema_type: SchemaType = "json"
    response_mode: Literal["text", "tool_call"] = "text"
    tool_name: str | None = None
    tool_payload_key: str | None = None
    strict_schema: bool | None = None


class StructuredOutputsVerifyResponse(StructuredOutputsVerifyRequest, BaseVerifyResponse):
    error_type: ErrorType | None = None
    error_message: str | None = None
    payload_source: Literal["fenced_block", "full_text", "tool_call"] | None = None
    parsed_output: Any = None


class SubmissionReceipt(BaseModel):
    status: str = "recorded"
    note: str = "The submission is graded when the episode ends."


class _Failure(Exception):
    def __init__(self, error_type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


class StructuredOutputsResourcesServer(SimpleResourcesServer):
    config: StructuredOutputsResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        # Tool-call mode with an executing agent: any submission tool is acknowledged (grading reads the trajectory).
        app.post("/{tool_name}")(self.record_submission)
        return app

    async def record_submission(self, tool_name: str) -> SubmissionReceipt:
        return SubmissionReceipt()

    async def verify(self, body: StructuredOutputsVerifyRequest) -> StructuredOutputsVerifyResponse:
        found: dict[str, Any] = {}
        try:
            schema = self._schema(body)
            if body.response_mode == "tool_call":
                payload, found["payload_source"] = self._tool_payload(body), "tool_call"
            else:
                payload, found["payload_source"] = self._text_payload(body, schema)
            found["parsed_output"] = payload
            problem = validation_error(payload, schema, self.config.check_formats)
            if problem is not None:
                raise _Failure("validation_error", problem)
        except _Failure as failure:
            return StructuredOutputsVerifyResponse(
                **body.model_dump(), **found, reward=0.0, error_type=failure.error_type, error_message=failure.message
            )
        return StructuredOutputsVerifyResponse(**body.model_dump(), **found, reward=1.0)

    def _schema(self, body: StructuredOutputsVerifyRequest) -> dict[str, Any]:
        if body.response.error is not None or body.response.status == "failed":
            detail = body.response.error.message if body.response.error else "the response failed"
            raise _Failure("api_error", detail)
        try:
            if body.schema_str is None and body.json_schema is None and body.response_mode == "tool_call":
                schema = self._tool_parameters(body)
            else:
                schema = load_schema(body.schema_str, body.json_schema)
        except ValueError as e:
            raise _Failure("schema_error", str(e)) from e
        strict = self.config.strict_schema if body.strict_schema is None else body.strict_schema
        schema = strictify(schema) if strict else schema
        problem = check_schema(schema)
        if problem is not None:
            raise _Failure("schema_error", problem)
        return schema

    def _tool_parameters(self, body: StructuredOutputsVerifyRequest) -> dict[str, Any]:
        """Without a row schema, the named tool's parameters are the schema (its payload property, with a key)."""
        tool = next((t for t in body.responses_create_params.tools or [] if t.name == body.tool_name), None)
        if tool is None or not isinstance(tool.parameters, dict):
            raise _Failure("schema_error", f"no schema in the row and no parameters for tool {body.tool_name!r}")
        if body.tool_payload_key is None:
            return tool.parameters
        schema = (tool.parameters.get("properties") or {}).get(body.tool_payload_key)
        if not isinstance(schema, dict):
            raise _Failure("schema_error", f"tool {tool.name!r} has no parameter {body.tool_payload_key!r}")
        return schema

    def _text_payload(self, body: StructuredOutputsVerifyRequest, schema: dict[str, Any]) -> tuple[Any, str]:
        text = assistant_text(body.response)
        if not text.strip():
            raise _Failure("empty_response", "the reply has no text")
        payload, source = extract_payload(text, body.schema_type)
        try:
            return parse_payload(payload, body.schema_type, schema, self.config.xml_coerce_types), source
        except PayloadError as e:
            raise _Failure("parse_error", str(e)) from e
        except RecursionError as e:
            raise _Failure("parse_error", "the payload is nested too deeply") from e

    def _tool_payload(self, body: StructuredOutputsVerifyRequest) -> Any:
        calls = function_calls(body.response)
        if not calls:
            raise _Failure("missing_tool_call", "the trajectory has no function call")
        if len(calls) > 1:
            raise _Failure("multiple_tool_calls", f"expected one function call, found {len(calls)}")
        call = calls[0]
        if body.tool_name is not None and call.name != body.tool_name:
            raise _Failure("wrong_tool_name", f"called {call.name!r}, expected {body.tool_name!r}")
        if call.arguments is None:
            raise _Failure("tool_arguments_parse_error", call.error or "unreadable arguments")
        if body.tool_payload_key is None:
            return call.arguments
        if body.tool_payload_key not in call.arguments:
            raise _Failure("missing_tool_payload_key", f"the arguments have no {body.tool_payload_key!r} member")
        return call.arguments[body.tool_payload_key]

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Defaults, plus reward per format and response mode, and how often each error occurs."""
        metrics = aggregate_verify_responses(body.verify_responses)
        rows = body.verify_responses
        for field in ("schema_type", "response_mode", "error_type"):
            metrics.agent_metrics |= category_metrics(rows, field)
        return metrics


if __name__ == "__main__":
    StructuredOutputsResourcesServer.run_webserver()
