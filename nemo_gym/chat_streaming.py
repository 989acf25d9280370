"""NeMo Gym 0.7's ``nemo_gym.chat_streaming``: Chat Completions streaming, under its 0.7 name.

A chat answer becomes its chunk stream in ``StreamingMiddleware`` (``nemo_gym/streaming.py``), for every model server;
``chat_completion_chunks`` makes the chunks and ``_sse_data`` encodes one (a bare ``data:`` line).
"""

from __future__ import annotations

from nemo_gym.streaming import chat_completion_chunks
from nemo_gym.streaming import sse_data as _sse_data

__all__ = ["_sse_data", "chat_completion_chunks"]
