"""A deadline for reading a request (issue 22, finding 7: 1,000 slow sockets were held 20 s and
more). uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` but has no
limit on how long the headers and body of a request may take to arrive: a client that opens a
connection and sends nothing, or a byte a second, holds it (and its memory) for ever.

``protocol(read_timeout_s)`` is uvicorn's httptools protocol with one more timer: armed when a
connection opens and again after each response, disarmed once the whole request (headers and
body) has arrived; when it fires first the connection is closed. The handling of a request
(a slow report) is not limited by it.
"""

from __future__ import annotations

import logging

log = logging.getLogger("timeshare.gateway")


def protocol(read_timeout_s: float):
    """The ``http`` protocol class for ``uvicorn.Config`` (or "auto" without httptools)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        log.warning("httptools missing: no deadline for reading a request (slow clients hold connections)")
        return "auto"

    class ReadDeadlineProtocol(HttpToolsProtocol):
        _read_deadline = None

        def _arm(self) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(read_timeout_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def _read_timed_out(self) -> None:
            self._read_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection has as long

    return ReadDeadlineProtocol
