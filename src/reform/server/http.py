"""The HTTP/1.1 connection ``reform serve`` runs: uvicorn's httptools protocol with a deadline on each
request's head. Without one, a client that sends its headers a byte every few seconds holds a connection
for as long as it likes (slowloris): uvicorn's keep-alive timeout only covers idle time between requests,
and every byte resets it."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 10.0      # from a request's first byte (or the connection's opening) to its last header
KEEP_ALIVE_S = 5             # an idle keep-alive connection is closed after this long (uvicorn's own)

TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def protocol(header_timeout: float = HEADER_TIMEOUT_S) -> type[asyncio.Protocol]:
    """uvicorn's ``http`` protocol class with ``header_timeout`` on every request's head: past it, a 408
    and the connection closed."""

    class HeadDeadline(HttpToolsProtocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.arm()

        def on_message_begin(self) -> None:        # a request's first byte (a keep-alive connection's next)
            super().on_message_begin()
            self.arm()

        def on_headers_complete(self) -> None:
            self.disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self.disarm()
            super().connection_lost(exc)

        def arm(self) -> None:
            if self.deadline is None:
                self.deadline = self.loop.call_later(header_timeout, self.head_too_slow)

        def disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def head_too_slow(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                self.transport.write(TIMED_OUT)
                self.transport.close()

    return HeadDeadline
