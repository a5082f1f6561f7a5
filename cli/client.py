"""An HTTP client of the admin REST API: what llmgw-cli knows of the server.

A request and its whole answer, within bounds of time and size, and every failure turned
into a ``ClientError``: what each command's call of the API goes through. What only some
commands ask for lives beside it: ``cli.key_requests`` (keys), ``cli.history_pages``
(history), ``cli.paging`` (how far a listing reads), ``cli.streamed_lines`` (``events
--follow``), ``cli.tuning`` (bench's settings) and ``cli.readiness`` (``/readyz``).

Wire types are declared from the API's JSON, not imported from the server, so the CLI
depends on the API and nothing behind it. Every failure is a ``ClientError`` whose message
says what to do::

    ClientError
    ├── AdminUnreachable        no answer: refused, unknown host, timed out, cut off
    │   └── AnswerLost          a change sent, and sent once more with the same
    │                           Idempotency-Key, whose answers never came: it may have
    │                           been done
    ├── TlsFailure              the TLS handshake failed, or the TLS settings are unusable
    ├── AuthenticationRequired  401: no token, or one the server does not know
    ├── AnswerTooLarge          an answer (or one record of a stream) past MAX_ANSWER_BYTES
    ├── EndlessListing          a listing past MAX_PAGES pages, or a cursor that stays put
    ├── RepeatingListing        a listing page that holds again what it listed before
    ├── OlderServer             no such path or method, or a field it does not know: the
    │                           server runs an older release than this llmgw-cli
    └── ApiProblem              any other error answer; its problem ``detail`` is the message
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType, TracebackType
from typing import Self, TypeVar

import httpx
import msgspec

from app.pki.errors import TlsConfigurationError
from cli.config import SETTING_ENV, ConnectionSettings
from wire.bounded_body import size_words
from wire.version import llmgw_version

USER_AGENT = "llmgw-cli/0.1"
ADMIN = "/admin/v1"
"""Where the admin API's paths begin."""
ANSWER_WITHIN_S = 60.0
"""The longest a whole answer may take: a read timeout alone lets a server (or a proxy)
that sends a byte now and then hold a command for ever."""
MAX_ANSWER_BYTES = 64 * 2**20
"""The largest answer the client reads, and for a stream the largest record (one event of
``events --follow``): far above any the admin API sends, so that a server that is not it,
or a broken one, cannot make the CLI hold an answer without end. A compressed answer counts
as it is once decompressed (each piece the connection brings at most some tens of MiB)."""

READING_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Requests that change nothing: one whose answer was lost is only unanswered."""
IDEMPOTENCY_HEADER = "idempotency-key"
"""Sent with every change, a new key each (or those ``--idempotency-key`` gives): the admin
API records a change sent again with its key once (``AdminClient.change``)."""
SENT_AGAIN = "It was sent once more with the same Idempotency-Key and got no answer either"

_T = TypeVar("_T")
_E = TypeVar("_E", bound=BaseException)


class ClientError(Exception):
    """The request did not succeed; the message is meant for the operator."""


class AdminUnreachable(ClientError):
    pass


class AnswerLost(AdminUnreachable):
    """A change was sent and its answer did not come back: it may have been carried out.
    Raised once it was sent again with its key and that answer did not come back either
    (``AdminClient.change``)."""


class TlsFailure(ClientError):
    pass


class AuthenticationRequired(ClientError):
    pass


class AnswerTooLarge(ClientError):
    pass


class EndlessListing(ClientError):
    """The admin API kept answering pages past ``cli.paging.MAX_PAGES``, or one whose cursor
    does not move on: read on, it would send pages for ever."""


class RepeatingListing(ClientError):
    """A page of a listing holds an item an earlier page held, or holds one twice: the
    server is not paging as asked, so the listing cannot be trusted to be whole."""


class OlderServer(ClientError):
    """The admin API has no such path, or not that method on it, or refused a field of the
    body as unknown: every one this client sends, a server of its own release knows, so the
    server runs an older one (as while a fleet is upgraded: control planes first)."""


class ApiProblem(ClientError):
    def __init__(
        self,
        status: int,
        detail: str,
        errors: tuple[FieldError, ...] = (),
        *,
        title: str = "",
        extra: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.errors = errors
        """Each field the API refused and why (an invalid model spec)."""
        self.title = title
        """The kind of problem as the API names it (``no-room-to-drain``); empty if none."""
        self.extra: Mapping[str, object] = MappingProxyType(dict(extra or {}))
        """The problem document's members this class has no attribute for (a refused
        drain's ``room``), as JSON decodes them: as large as the answer may be
        (``MAX_ANSWER_BYTES``) and of any shape, so a command that reads one checks it."""


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


class Problem(msgspec.Struct, frozen=True):
    detail: str = ""
    title: str = ""


class FieldError(msgspec.Struct, frozen=True):
    field: str = ""
    reason: str = ""


class FieldErrors(msgspec.Struct, frozen=True):
    errors: list[FieldError] = []


UNREADABLE = (msgspec.DecodeError, RecursionError)
"""What decoding an answer raises when it is no document the client can read: not JSON, not
the shape expected, or nested deeper than the decoder recurses (even in a member it skips)."""

_members_decoder = msgspec.json.Decoder(dict[str, object])


def new_idempotency_key() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Answer:
    """One answer of the admin API: its status, headers and whole body."""

    status: int
    headers: httpx.Headers
    body: bytes


# -- the client --------------------------------------------------------------------------


class AdminClient:
    """Synchronous; one connection pool per instance. Use it as a context manager."""

    def __init__(
        self,
        settings: ConnectionSettings,
        *,
        timeout_s: float = 10.0,
        answer_within_s: float = ANSWER_WITHIN_S,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``transport`` sends the requests instead of httpx's own connections (a test's
        ``httpx.MockTransport``); the TLS settings then do not apply."""
        self.settings = settings
        self.timeout_s = timeout_s
        self.answer_within_s = answer_within_s
        self.max_answer_bytes = max_answer_bytes
        self._url = httpx.URL(settings.admin_url)
        self._changes_sent = 0
        headers = {"user-agent": USER_AGENT}
        if settings.token:
            headers["authorization"] = f"Bearer {settings.token}"
        self.http = httpx.Client(
            base_url=settings.admin_url,
            headers=headers,
            timeout=timeout_s,
            verify=_tls_context(settings) if self._url.scheme == "https" else _no_tls(),
            trust_env=False,
            transport=transport,
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
        self.http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, int | str] | None = None,
        body: object = None,
    ) -> bytes:
        """One call of the admin API (``body``, if any, sent as JSON); the answer's body."""
        return self.request_answer(method, path, params=params, body=body).body

    def request_answer(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, int | str] | None = None,
        body: object = None,
    ) -> Answer:
        """``request``, with the answer's status and headers too (a successful one: an error
        answer is raised, as ``request`` raises it)."""
        content = None if body is None else msgspec.json.encode(body)
        headers = {"content-type": "application/json"} if content is not None else {}
        if method in READING_METHODS:
            answer = self.exchange(method, path, params, content, headers)
        else:
            headers[IDEMPOTENCY_HEADER] = self._next_key()
            answer = self.change(method, path, params, content, headers)
        if 200 <= answer.status < 300:
            return answer
        error = self.error_answer(httpx.Response(answer.status, content=answer.body))
        if isinstance(error, ApiProblem) and _unknown_to_the_server(error):
            raise self._older_server(method, path, error) from error
        raise error

    def _next_key(self) -> str:
        """The key of the next change: a new one, or with ``--idempotency-key K``, K for the
        first change, K.2 for the second and so on, the same on every run of the command."""
        self._changes_sent += 1
        given = self.settings.idempotency_key
        if given is None:
            return new_idempotency_key()
        return given if self._changes_sent == 1 else f"{given}.{self._changes_sent}"

    def change(
        self,
        method: str,
        path: str,
        params: Mapping[str, int | str] | None,
        content: bytes | None,
        headers: Mapping[str, str],
    ) -> Answer:
        """``exchange`` for a change sent with its ``Idempotency-Key``: when its answer is
        lost, it is sent once more with the same key, which the admin API carries out at
        most once and answers as it did the first time."""
        try:
            return self.exchange(method, path, params, content, headers)
        except AnswerLost as lost:
            try:
                return self.exchange(method, path, params, content, headers)
            except AnswerLost as again:
                raise AnswerLost(f"{lost}. {SENT_AGAIN}{self._run_again_advice()}") from again
            except ClientError as again:
                raise AnswerLost(
                    f"{lost}. {SENT_AGAIN}: {again}{self._run_again_advice()}"
                ) from again

    def _run_again_advice(self) -> str:
        given = self.settings.idempotency_key
        if given is None:
            return ""
        return (
            f". Running the same command again with --idempotency-key {given} is safe: the "
            "admin API carries out its change at most once"
        )

    def exchange(
        self,
        method: str,
        path: str,
        params: Mapping[str, int | str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One request; the answer's status, headers and whole body, within the time and
        size bounds."""
        deadline = time.monotonic() + self.answer_within_s
        try:
            with self.http.stream(
                method, path, params=dict(params or {}), content=content, headers=headers
            ) as streamed:
                body = self.whole_body(streamed, deadline)
                return Answer(streamed.status_code, streamed.headers, body)
        except httpx.TransportError as exc:
            raise self.transport_failure(exc) from exc

    def whole_body(self, streamed: httpx.Response, deadline: float) -> bytes:
        declared = streamed.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_answer_bytes:
            raise self.too_large(streamed, "an answer")
        answer = bytearray()
        for chunk in streamed.iter_bytes():
            answer += chunk
            if len(answer) > self.max_answer_bytes:
                raise self.too_large(streamed, "an answer")
            if time.monotonic() > deadline:
                raise self._too_slow()
        return bytes(answer)

    def too_large(self, streamed: httpx.Response, what: str) -> ClientError:
        request = streamed.request
        return AnswerTooLarge(
            f"the admin API at {self.settings.admin_url} sent {what} over "
            f"{size_words(self.max_answer_bytes)}, the most llmgw-cli reads "
            f"({request.method} {request.url}): it is not the llmgw admin API, or it (or a "
            f"proxy in front of it) is broken; check {SETTING_ENV['admin_url']}"
        )

    def _too_slow(self) -> ClientError:
        return AdminUnreachable(
            f"the admin API at {self.settings.admin_url} sent no whole answer within "
            f"{self.answer_within_s:g} s: it, or a proxy in front of it, is stalling; "
            "try again, and if it persists check the server's log"
        )

    def transport_failure(self, exc: httpx.TransportError) -> ClientError:
        url = self.settings.admin_url
        if _in_chain(exc, ssl.SSLError) is not None:
            return TlsFailure(f"TLS handshake with the admin API at {url} failed: {self._why(exc)}")
        lost = self._answer_lost(exc)
        if lost is not None:
            return lost
        if isinstance(exc, httpx.TimeoutException):
            reason = f"no answer within {self.timeout_s:g} s"
        elif _in_chain(exc, ConnectionRefusedError) is not None:
            reason = "connection refused"
        elif _in_chain(exc, socket.gaierror) is not None:
            reason = f"cannot resolve the host name {self._url.host!r}"
        elif isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
            if self._url.scheme == "https":
                return self._closed_over_tls(exc)
            return AdminUnreachable(
                f"the admin API at {url} broke off the exchange "
                f"({str(exc) or type(exc).__name__}): {self._cut_off_advice()}"
            )
        else:
            reason = str(exc) or type(exc).__name__
        return AdminUnreachable(
            f"cannot reach the admin API at {url}: {reason} — is llmgw-server running there? "
            f"For another address, give --admin-url or set {SETTING_ENV['admin_url']}"
        )

    def _closed_over_tls(self, exc: httpx.TransportError) -> ClientError:
        """The server closed the connection without answering, over TLS. An asyncio TLS
        server that rejects a client certificate drops the connection without a TLS alert
        once the handshake is over on this side (TLS 1.3): all this side sees is the cut,
        as when the answer is lost after the request went out. A new connection that asks
        for nothing tells the two apart: one that is answered carried the certificate
        through the handshake, so it was the answer that was lost."""
        if not self._handshake_accepted():
            return TlsFailure(
                f"TLS with the admin API at {self.settings.admin_url} failed: the server "
                f"closed the connection without answering; {self._refused_certificate_advice()}"
            )
        lost = self._answer_lost(exc, accepted_over_tls=True)
        if lost is not None:
            return lost
        return AdminUnreachable(
            f"the admin API at {self.settings.admin_url} closed the connection before its "
            f"answer came ({str(exc) or type(exc).__name__}); the TLS handshake and the "
            "client certificate are accepted: try again, and if it persists check the "
            "server's log"
        )

    def _handshake_accepted(self) -> bool:
        """Whether a new connection, with the same TLS settings, gets an answer to a request
        that changes nothing and needs no credentials (``/healthz``): any status will do,
        and its body is not read."""
        try:
            with self.http.stream("GET", "/healthz", timeout=self.timeout_s):
                pass
        except httpx.TransportError:
            return False
        return True

    def _answer_lost(
        self, exc: httpx.TransportError, *, accepted_over_tls: bool = False
    ) -> AnswerLost | None:
        """A change whose request went out, and whose answer did not come back: a read that
        timed out, or a connection closed then; over TLS, only once a new connection showed
        that the handshake accepts the client certificate (``_closed_over_tls``), since a
        connection closed then is also how a refused one shows."""
        try:
            request = exc.request
        except RuntimeError:
            return None
        if request.method in READING_METHODS:
            return None
        if isinstance(exc, httpx.ReadTimeout):
            why = f"no answer within {self.timeout_s:g} s"
        elif isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
            if self._url.scheme == "https" and not accepted_over_tls:
                return None
            why = str(exc) or type(exc).__name__
        else:
            return None
        return AnswerLost(
            f"the connection to the admin API at {self.settings.admin_url} broke before its "
            f"answer came ({why}): {request.method} {request.url.path} was sent and may have "
            "been carried out. See what the log recorded (`llmgw-cli events --last 20`) "
            "before sending it again; docs/admin-api.md#sending-a-change-again says what a "
            "repeat of each change does"
        )

    def _cut_off_advice(self) -> str:
        return "does the URL's scheme (http or https) match the server's?"

    def _refused_certificate_advice(self) -> str:
        certificate = self.settings.client_cert
        if certificate is None:
            return (
                f"if it requires an operator certificate, set {SETTING_ENV['client_cert']} "
                f"and {SETTING_ENV['client_key']} (`llmgw-cli cert operator <name>` issues one)"
            )
        return (
            f"it most likely refused the client certificate {certificate}: check that it was "
            "issued by the llmgw CA the server trusts (`llmgw-cli cert show "
            f"{certificate}` names its issuer)"
        )

    def _why(self, exc: httpx.TransportError) -> str:
        # Imported here, as in _tls_context: cryptography loads only where TLS is in play.
        from app.pki.explain import explain_tls_failure
        from app.pki.tls import fetch_presented_certificate

        host = self._url.host
        port = self._url.port or 443
        verification_failed = _in_chain(exc, ssl.SSLCertVerificationError) is not None
        presented = fetch_presented_certificate(host, port) if verification_failed else None
        return explain_tls_failure(exc, host, presented)

    def error_answer(self, response: httpx.Response) -> ClientError:
        if response.status_code == 401:
            return AuthenticationRequired(self._authentication_advice())
        document = _problem_document(response.content)
        problem = _converted(document, Problem) or Problem()
        detail = problem.detail or problem.title
        if not detail:
            detail = (
                f"{self.settings.admin_url} answered HTTP {response.status_code} "
                f"{response.reason_phrase} without a problem document, so it is not the llmgw "
                f"admin API (or a proxy in front of it failed): check {SETTING_ENV['admin_url']}"
            )
        sent = _converted(document, FieldErrors) or FieldErrors()
        return ApiProblem(
            response.status_code,
            detail,
            tuple(error for error in sent.errors if error.field),
            title=problem.title,
            extra={k: v for k, v in document.items() if k not in PROBLEM_MEMBERS},
        )

    def _older_server(self, method: str, path: str, problem: ApiProblem) -> OlderServer:
        return OlderServer(
            f"the admin API at {self.settings.admin_url} does not know {method} {path} "
            f"({problem}): it runs an older llmgw release than this llmgw-cli "
            f"({llmgw_version()}); upgrade the control planes first (docs/operations.md"
            "#upgrades), or use the llmgw-cli of the server's release"
        )

    def _authentication_advice(self) -> str:
        config = self.settings.config_file or "the config file"
        where = f"set {SETTING_ENV['token']} (or pass --token, or set token in {config})"
        if self._url.scheme == "https" and self.settings.client_cert is None:
            where += (
                f", or present an operator certificate: set {SETTING_ENV['client_cert']} and "
                f"{SETTING_ENV['client_key']} (`llmgw-cli cert operator <name>` issues one)"
            )
        if not self.settings.token:
            return f"authentication required: {where}"
        return f"authentication required: the admin API refused the token given; {where}"


def _tls_context(settings: ConnectionSettings) -> ssl.SSLContext:
    from app.pki.tls import client_ssl_context  # cryptography: for https only

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


def _no_tls() -> ssl.SSLContext:
    """For an http admin URL, which the client never leaves (it follows no redirect): a
    context that trusts no CA, so that no TLS connection could verify. httpx's own default
    loads the whole CA bundle into one, a tenth of a second of every command's start."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


ROUTER_NOT_FOUND = ("Not Found", "no such path: ")
"""How the admin API's router says no route has the path: a release before the path was
named said only ``Not Found``. A 404 of the API's own (``unknown-drain``: no drain of that
id) has a title of its own, and one for a malformed path segment another detail."""
UNKNOWN_FIELD = "Object contains unknown field"
"""msgspec's words for a body member the server's type lacks (``(body): Object contains
unknown field `expires_at```): a field added after the server's release."""


def _unknown_to_the_server(problem: ApiProblem) -> bool:
    """Whether ``problem`` says the server lacks the route, the method or a body field that
    this client's release has."""
    detail = str(problem)
    if problem.status == 404 and problem.title == "not-found":
        return detail == ROUTER_NOT_FOUND[0] or detail.startswith(ROUTER_NOT_FOUND[1])
    if problem.status == 405:
        return problem.title == "method-not-allowed"
    return problem.status == 400 and detail.startswith("(body): ") and UNKNOWN_FIELD in detail


def decode(decoder: msgspec.json.Decoder[_T], body: bytes, what: str) -> _T:
    try:
        return decoder.decode(body)
    except UNREADABLE as exc:
        raise unreadable(f"a {what}", exc) from exc


def unreadable(what: str, exc: Exception) -> ApiProblem:
    """The problem of a 200 answer that is no ``what`` (``an event``) this client can read:
    ``exc``, one of ``UNREADABLE``, says why."""
    return ApiProblem(200, f"the admin API sent {what} this client cannot read: {exc}")


PROBLEM_MEMBERS = frozenset({"type", "title", "status", "detail", "instance", "errors"})
"""RFC 9457's members of a problem document, and the admin API's ``errors``
(``ApiProblem``'s attributes)."""


def _problem_document(content: bytes) -> dict[str, object]:
    """An error answer's body, decoded once, as the members of a JSON object (a problem
    document); none when it is no JSON object the client can read."""
    try:
        return _members_decoder.decode(content)
    except UNREADABLE:
        return {}


def _converted(document: dict[str, object], shape: type[_T]) -> _T | None:
    """The members of ``document`` that ``shape`` declares, as ``shape``; None when one of
    them is not of its type (each shape is read on its own: a bad ``errors`` costs no
    ``detail``)."""
    try:
        return msgspec.convert(document, shape)
    except msgspec.ValidationError:
        return None


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
