"""uvicorn's HTTP protocol, changed to send each response in one write instead of two.

uvicorn writes a response's status line and headers as soon as the app sends ``http.response.start``, then the body
in a second write. On loopback every write is a full trip through the kernel's TCP stack for both ends (and, with
``TCP_NODELAY``, a packet of its own that the client parses separately), so for the small JSON bodies that servers
exchange, the second write is a large share of the cost of a request. Here the head is held back until the body
arrives, which in practice is the same event-loop step, and both leave in one ``send``. If no body follows within
that step (a streaming response waiting for data), the head is flushed on the next loop iteration, so nothing is
delayed by more than one iteration.

A connection also drops its finished request as soon as the answer is out, so an idle keep-alive connection costs only
the connection itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol"]

_HEAD_END = b"\r\n\r\n"
_JOIN_LIMIT = 64 * 1024


class _CoalescingTransport:
    """Wraps one connection's transport: a response head waits for the next write, or for the next loop iteration."""

    __slots__ = ("_flush_handle", "_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(data) <= _JOIN_LIMIT:
                self._transport.write(head + bytes(data))
            else:  # a large body is not copied: writelines hands both buffers to the kernel at once
                self._transport.writelines([head, data])
            return
        if isinstance(data, bytes) and data.endswith(_HEAD_END) and data.startswith(b"HTTP/"):
            self._head = data
            if self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        self._flush_handle = None
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        pending = len(self._head) if self._head is not None else 0
        return self._transport.get_write_buffer_size() + pending

    def __getattr__(self, name: str) -> Any:
        # Everything else (extra info, flow control, is_closing, set_protocol) is the real transport's.
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose responses leave in one write, and whose idle connections hold no request;
    pass it as ``uvicorn.Config(http=...)``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        """Forget the finished request, as uvicorn does not until the next one arrives.

        A keep-alive connection otherwise holds its last request's cycle and scope (headers, and whatever the app
        left in the scope) while it waits: ~6 KB per idle connection, ~6 MB in a server that a thousand rollouts keep
        connections to. Only a request that was read to its end, whose answer is complete and with nothing pipelined
        behind it, is forgotten; every uvicorn path treats a missing cycle as "no request", and the cycle's task keeps
        its own reference until it ends.
        """
        super().on_response_complete()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not cycle.more_body and not self.pipeline:
            self.cycle = None  # type: ignore[assignment]
            self.scope = None  # type: ignore[assignment]
            self.headers = None  # type: ignore[assignment]
