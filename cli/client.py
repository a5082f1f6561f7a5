"""An HTTP client of the admin REST API: what llmgw-cli knows of the server.

Wire types are declared here from the API's JSON, not imported from the server, so the
CLI depends on the API and nothing behind it. Every failure is a ``ClientError`` whose
message says what to do::

    ClientError
    ├── AdminUnreachable        no answer: refused, unknown host, timed out, cut off
    ├── TlsFailure              the TLS handshake failed, or the TLS settings are unusable
    ├── AuthenticationRequired  401: no token, or one the server does not know
    └── ApiProblem              any other error answer; its problem ``detail`` is the message
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Self, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from app.pki import (
    TlsConfigurationError,
    client_ssl_context,
    explain_tls_failure,
    fetch_presented_certificate,
)
from cli.config import SETTING_ENV, ConnectionSettings

USER_AGENT = "llmgw-cli/0.1"
HISTORY_PAGE_SIZE = 500
HISTORY_SUBJECTS = ("replica", "node", "model", "key")

_T = TypeVar("_T")
_E = TypeVar("_E", bound=BaseException)


class ClientError(Exception):
    """The request did not succeed; the message is meant for the operator."""


class AdminUnreachable(ClientError):
    pass


class TlsFailure(ClientError):
    pass


class AuthenticationRequired(ClientError):
    pass


class ApiProblem(ClientError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


# -- wire types --------------------------------------------------------------------------


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    """One event as ``/admin/v1/history`` shows it (fields the CLI does not use are skipped)."""

    position: int
    recorded_at: datetime
    stream: str
    type: str
    actor: str
    summary: str = ""
    correlation_id: str | None = None
    causation_id: str | None = None


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[msgspec.Raw]
    next_after: int | None = None


class Problem(msgspec.Struct, frozen=True):
    detail: str = ""
    title: str = ""


@dataclass(frozen=True)
class HistoryEvent:
    view: EventView
    raw: msgspec.Raw
    """The event exactly as the API sent it (``--output json`` prints these)."""


_event_decoder = msgspec.json.Decoder(EventView)
_page_decoder = msgspec.json.Decoder(HistoryPage)
_problem_decoder = msgspec.json.Decoder(Problem)


# -- the client --------------------------------------------------------------------------


class AdminClient:
    """Synchronous; one connection pool per instance. Use it as a context manager."""

    def __init__(self, settings: ConnectionSettings, *, timeout_s: float = 10.0) -> None:
        self._settings = settings
        self._url = httpx.URL(settings.admin_url)
        headers = {"user-agent": USER_AGENT}
        if settings.token:
            headers["authorization"] = f"Bearer {settings.token}"
        self._http = httpx.Client(
            base_url=settings.admin_url,
            headers=headers,
            timeout=timeout_s,
            verify=_tls_context(settings) if self._url.scheme == "https" else True,
            trust_env=False,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def history(
        self, subject: str, key: str, *, after: int = 0, limit: int | None = None
    ) -> list[HistoryEvent]:
        """Every event about one replica, node, model or key after position ``after``,
        oldest first, reading page after page; at most ``limit`` events if given."""
        return list(self._iter_history(subject, key, after, limit))

    def _iter_history(
        self, subject: str, key: str, after: int, limit: int | None
    ) -> Iterator[HistoryEvent]:
        if subject not in HISTORY_SUBJECTS:
            raise ValueError(f"subject must be one of {', '.join(HISTORY_SUBJECTS)}")
        remaining = limit
        while remaining is None or remaining > 0:
            size = HISTORY_PAGE_SIZE if remaining is None else min(remaining, HISTORY_PAGE_SIZE)
            body = self._get(
                f"/admin/v1/history/{subject}/{quote(key, safe='')}",
                {"after": after, "limit": size},
            )
            page = _decode(_page_decoder, body, "history page")
            for raw in page.events:
                yield HistoryEvent(view=_decode(_event_decoder, raw, "event"), raw=raw)
            if remaining is not None:
                remaining -= len(page.events)
            if page.next_after is None:
                return
            after = page.next_after

    def _get(self, path: str, params: Mapping[str, int | str]) -> bytes:
        try:
            response = self._http.get(path, params=dict(params))
        except httpx.TransportError as exc:
            raise self._transport_failure(exc) from exc
        if response.is_success:
            return response.content
        raise self._error_answer(response)

    def _transport_failure(self, exc: httpx.TransportError) -> ClientError:
        url = self._settings.admin_url
        if _in_chain(exc, ssl.SSLError) is not None:
            return TlsFailure(f"TLS handshake with the admin API at {url} failed: {self._why(exc)}")
        if isinstance(exc, httpx.TimeoutException):
            reason = "no answer in time"
        elif _in_chain(exc, ConnectionRefusedError) is not None:
            reason = "connection refused"
        elif _in_chain(exc, socket.gaierror) is not None:
            reason = f"cannot resolve the host name {self._url.host!r}"
        elif isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
            return AdminUnreachable(
                f"the admin API at {url} broke off the exchange ({exc or type(exc).__name__}): "
                f"{self._cut_off_advice()}"
            )
        else:
            reason = str(exc) or type(exc).__name__
        return AdminUnreachable(
            f"cannot reach the admin API at {url}: {reason} — is llmgw-server running? "
            f"set {SETTING_ENV['admin_url']}"
        )

    def _cut_off_advice(self) -> str:
        advice = "does the URL's scheme (http or https) match the server's?"
        if self._url.scheme == "https" and self._settings.client_cert is None:
            advice += (
                f" If it requires an operator certificate, set {SETTING_ENV['client_cert']} "
                f"and {SETTING_ENV['client_key']} (`llmgw-cli cert operator <name>` issues one)"
            )
        return advice

    def _why(self, exc: httpx.TransportError) -> str:
        host = self._url.host
        port = self._url.port or 443
        verification_failed = _in_chain(exc, ssl.SSLCertVerificationError) is not None
        presented = fetch_presented_certificate(host, port) if verification_failed else None
        return explain_tls_failure(exc, host, presented)

    def _error_answer(self, response: httpx.Response) -> ClientError:
        if response.status_code == 401:
            return AuthenticationRequired(self._authentication_advice())
        try:
            problem = _problem_decoder.decode(response.content)
        except msgspec.DecodeError:
            problem = Problem()
        detail = problem.detail or problem.title
        if not detail:
            detail = (
                f"{self._settings.admin_url} answered HTTP {response.status_code} "
                f"{response.reason_phrase} without a problem document, so it is not the llmgw "
                f"admin API (or a proxy in front of it failed): check {SETTING_ENV['admin_url']}"
            )
        return ApiProblem(response.status_code, detail)

    def _authentication_advice(self) -> str:
        config = self._settings.config_file or "the config file"
        where = f"set {SETTING_ENV['token']} (or pass --token, or set token in {config})"
        if not self._settings.token:
            return f"authentication required: {where}"
        return f"authentication required: the admin API refused the token given; {where}"


def _tls_context(settings: ConnectionSettings) -> ssl.SSLContext:
    try:
        if settings.ca_cert is not None:
            return client_ssl_context(settings.ca_cert, settings.client_cert, settings.client_key)
        context = ssl.create_default_context()
        if settings.client_cert is not None:
            context.load_cert_chain(settings.client_cert, settings.client_key)
        return context
    except TlsConfigurationError as exc:
        raise TlsFailure(str(exc)) from exc
    except (OSError, ssl.SSLError) as exc:
        raise TlsFailure(
            f"cannot load the client certificate {settings.client_cert} with key "
            f"{settings.client_key}: {exc}"
        ) from exc


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes, what: str) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiProblem(
            200, f"the admin API sent a {what} this client cannot read: {exc}"
        ) from exc


def _in_chain(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` or the first exception it was raised from or during that is a ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
