"""NeMo Gym 0.7's ``nemo_gym.responses_streaming``: the Responses side of streaming clients, under its 0.7 name.

Our model servers stream through ``StreamingMiddleware`` (``nemo_gym/streaming.py``), which needs nothing from a
server. A server that takes a streaming client's body itself (as 0.7's compaction model does) cleans it with
:func:`sanitize_streaming_responses_body` and gives the client its tool names back with
:func:`restore_namespace_tool_calls`; both live in ``nemo_gym/streaming_dialects.py``. ``_sse_event`` encodes one
Responses event (``streaming.sse_event``).
"""

from __future__ import annotations

from nemo_gym.streaming import sse_event as _sse_event
from nemo_gym.streaming_dialects import (
    NAMESPACE_TOOL_DELIMITER,
    NamespaceMap,
    flatten_namespace_tools,
    restore_namespace_tool_calls,
    sanitize_streaming_responses_body,
)

__all__ = [
    "NAMESPACE_TOOL_DELIMITER",
    "NamespaceMap",
    "_sse_event",
    "flatten_namespace_tools",
    "restore_namespace_tool_calls",
    "sanitize_streaming_responses_body",
]
