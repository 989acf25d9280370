"""Hosted-tool output items that need the ``openai`` SDK's own classes (imported here, so only on use).

Our item unions leave hosted-tool items (``mcp_call``, ``web_search_call``, ...) to the SDK's models. NeMo Gym 0.7 also
names one of them: :class:`NeMoGymResponseMcpCall`, an ``mcp_call`` some hosted endpoints emit when they run a tool
themselves, with no ``id`` or ``server_label`` and statuses beyond the SDK's. It subclasses the SDK's class, so our
``NeMoGymResponse`` accepts an instance as an output item, as it accepts the SDK's.
"""

from __future__ import annotations

from typing import Literal

from openai.types.responses.response_output_item import McpCall

__all__ = ["NeMoGymResponseMcpCall"]


class NeMoGymResponseMcpCall(McpCall):
    """A tool call the endpoint ran server-side: its ``output`` / ``error`` are already filled, nothing runs here."""

    type: Literal["mcp_call"] = "mcp_call"
    id: str | None = None  # type: ignore[assignment]  # relaxed: hosted endpoints may leave it out
    server_label: str | None = None  # type: ignore[assignment]
    status: str | None = None  # type: ignore[assignment]  # any status the endpoint reports
