"""The Responses <-> Messages mapping of this model server; it lives in the core (``nemo_gym/anthropic_policy.py``),
where ``AnthropicConverter`` (``nemo_gym/anthropic_converter.py``) shares it, and is re-exported here for this server's
code and tests."""

from nemo_gym.anthropic_policy import (
    SYSTEM_ROLES,
    Block,
    UnsupportedInputError,
    chat_completion_from_message,
    messages_request,
    output_items,
    response_from_message,
)

__all__ = [
    "SYSTEM_ROLES",
    "Block",
    "UnsupportedInputError",
    "chat_completion_from_message",
    "messages_request",
    "output_items",
    "response_from_message",
]
