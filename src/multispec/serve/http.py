"""The HTTP server around the app: uvicorn, with a limit uvicorn does not have. A client that opens a connection
and stops part-way through its request line or headers is held open for ever by uvicorn's protocols (its
keep-alive timeout runs only between requests, and stops at the first byte of the next one). Here a request's
headers must all arrive within `ServeSettings.read_timeout` seconds of the connection opening, or of the first
byte of a later request on it; otherwise the connection is closed without a reply, as nginx's
client_header_timeout closes it. (A body that stops part-way is the app's to answer: 408, edge.Edge.parse.)
"""
from __future__ import annotations


def uvicorn_config(app, **kwargs):
    """uvicorn.Config for `app` (built by create_app), with the header timeout above; kwargs go to uvicorn."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    timeout = app.state.settings.read_timeout
    return uvicorn.Config(app, http=_with_header_timeout(AutoHTTPProtocol, timeout), **kwargs)


def _with_header_timeout(base: type, seconds: float) -> type:
    """uvicorn's HTTP protocol class `base` (h11 or httptools: both set `self.cycle` when a request's headers are
    complete), closing a connection whose request headers have not all arrived `seconds` after it opened, or after
    the first byte of a later request (between requests, uvicorn's keep-alive timeout closes an idle one)."""

    class HeaderTimeout(base):
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm()  # a new request begins
            super().data_received(data)
            if self.cycle is not cycle:  # its headers are complete
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeout
