"""An HTTP client of the admin REST API: what llmgw-cli knows of the server.

Wire types are declared here from the API's JSON, not imported from the server, so the
CLI depends on the API and nothing behind it. Every failure is a ``ClientError`` whose
message says what to do::

    ClientError
    ├── AdminUnreachable        no answer: refused, unknown host, timed out, cut off
    ├── TlsFailure              the TLS handshake failed, or the TLS settings are unusable
    ├── AuthenticationRequired  401: no token, or one the server does not know
    ├── AnswerTooLarge          an answer (or one record of a stream) past MAX_ANSWER_BYTES
    ├── EndlessListing          a listing past MAX_PAGES pages, or a cursor that stays put
    ├── RepeatingListing        a listing page that holds again what it listed before
    └── ApiProblem              any other error answer; its problem ``detail`` is the message
"""

from __future__ import annotations

import itertools
import socket
import ssl
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType, TracebackType
from typing import Generic, Self, TypeVar

import httpx
import msgspec

from app.pki import (
    TlsConfigurationError,
    client_ssl_context,
    explain_tls_failure,
    fetch_presented_certificate,
)
from cli.arguments import segment
from cli.bounded_lines import BoundedLines, RecordTooLarge
from cli.config import SETTING_ENV, ConnectionSettings
from wire.bounded_body import size_words

USER_AGENT = "llmgw-cli/0.1"
HISTORY_PAGE_SIZE = 500
NEWEST = 2**63 - 1
"""The largest log position: history read back ``before`` it starts at the newest event."""
KEYS_PAGE_SIZE = 500
MAX_PAGES = 2_000
"""The most pages one listing (``keys list``, ``history``) reads: a million keys or events
at 500 a page, far above any llmgw holds, so that a server that is not the admin API, or a
broken one, that keeps answering full pages of new ones cannot make the CLI read for ever."""
HISTORY_SUBJECTS = ("replica", "node", "model", "key")
_HISTORY_KEYS = {
    "replica": "the replica id",
    "node": "the node id",
    "model": "the model name",
    "key": "the key prefix or name",
}
READYZ_PATH = "/readyz"
ANSWER_WITHIN_S = 60.0
"""The longest a whole answer may take: a read timeout alone lets a server (or a proxy)
that sends a byte now and then hold a command for ever."""
MAX_ANSWER_BYTES = 64 * 2**20
"""The largest answer the client reads, and for a stream the largest record (one event of
``events --follow``): far above any the admin API sends, so that a server that is not it,
or a broken one, cannot make the CLI hold an answer without end. A compressed answer counts
as it is once decompressed (each piece the connection brings at most some tens of MiB)."""

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


class AnswerTooLarge(ClientError):
    pass


class EndlessListing(ClientError):
    """The admin API kept answering pages past ``MAX_PAGES``, or one whose cursor does not
    move on: read on, it would send pages for ever."""


class RepeatingListing(ClientError):
    """A page of a listing holds an item an earlier page held, or holds one twice: the
    server is not paging as asked, so the listing cannot be trusted to be whole."""


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


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[msgspec.Raw]
    next_after: int | None = None
    next_before: int | msgspec.UnsetType | None = msgspec.UNSET
    """Unset in the answer of a server older than reading back with ``before``."""


class Problem(msgspec.Struct, frozen=True):
    detail: str = ""
    title: str = ""


class FieldError(msgspec.Struct, frozen=True):
    field: str = ""
    reason: str = ""


class FieldErrors(msgspec.Struct, frozen=True):
    errors: list[FieldError] = []


class Routing(msgspec.Struct, frozen=True, kw_only=True):
    weight: float
    target_waiting: int
    kv_ceiling: float


class TuningResult(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /admin/v1/models/{name}/tuning``'s answer."""

    changed: bool
    """False when these settings were already in force (nothing was recorded)."""
    model: str
    replica_id: str | None = None
    routing: Routing
    """The settings now in force for the model, or for the replica."""


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    """``/readyz``'s answer: whether the server can serve, and its role."""

    ready: bool = False
    role: str | None = None
    """``leader``, ``standby`` or ``stopped``; None for a server without a control plane."""
    failing: list[str] = []


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as ``/admin/v1/keys`` lists it (never its secret)."""

    id: str
    prefix: str
    name: str
    models: list[str] = []
    """``["*"]`` when the key may use every model."""
    rpm: int | None = None
    tpm: int | None = None
    created_at: datetime
    created_by: str = ""
    revoked: bool = False
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    expires_at: datetime | None = None
    """None: the key never expires (or the server is older than expiring keys)."""
    expired: bool = False
    """Whether the key had expired by the server's clock when it answered."""


class KeyCreated(KeyView, frozen=True, kw_only=True):
    key: str
    """The whole key: the server shows it this once."""


class KeyChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    key: KeyView


@dataclass(frozen=True)
class KeyReply(Generic[_T]):
    """A keys answer, decoded and as it came (``--output json`` prints ``raw``)."""

    value: _T
    raw: bytes


@dataclass(frozen=True)
class ListedKey:
    view: KeyView
    raw: msgspec.Raw
    """The key exactly as the API sent it (``--output json`` prints these)."""


@dataclass(frozen=True)
class HistoryEvent:
    view: EventView
    raw: msgspec.Raw
    """The event exactly as the API sent it (``--output json`` prints these)."""


_event_decoder = msgspec.json.Decoder(EventView)
_page_decoder = msgspec.json.Decoder(HistoryPage)
UNREADABLE = (msgspec.DecodeError, RecursionError)
"""What decoding an answer raises when it is no document the client can read: not JSON, not
the shape expected, or nested deeper than the decoder recurses (even in a member it skips)."""

_members_decoder = msgspec.json.Decoder(dict[str, object])
_key_created_decoder = msgspec.json.Decoder(KeyCreated)
_key_decoder = msgspec.json.Decoder(KeyView)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_key_change_decoder = msgspec.json.Decoder(KeyChange)
_tuning_decoder = msgspec.json.Decoder(TuningResult)
_readiness_decoder = msgspec.json.Decoder(Readiness)


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
        self._settings = settings
        self._answer_within_s = answer_within_s
        self._max_answer_bytes = max_answer_bytes
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
        self._http.close()

    def tune(
        self,
        model: str,
        *,
        weight: float,
        target_waiting: int,
        kv_ceiling: float,
        replica_id: str | None = None,
        summary: Mapping[str, object] | None = None,
        revision: int | None = None,
    ) -> TuningResult:
        """Apply routing settings (measured by bench) to ``model``, or to ``replica_id``
        alone; ``summary`` is kept with them in the log. With ``revision`` (the model's
        revision bench measured) the API refuses settings for a model now at another."""
        body = self.request(
            "POST",
            f"/admin/v1/models/{segment(model, 'the model name')}/tuning",
            body={
                "replica_id": replica_id,
                "weight": weight,
                "target_waiting": target_waiting,
                "kv_ceiling": kv_ceiling,
                "summary": dict(summary or {}),
                "revision": revision,
            },
        )
        return _decode(_tuning_decoder, body, "tuning result")

    def readiness(self) -> Readiness:
        """``/readyz``: whether the server can serve and whether it leads. A server that
        is not ready answers 503 with the same document, which is returned, not raised."""
        status, body = self._exchange("GET", READYZ_PATH)
        if status not in (200, 503):
            raise self._error_answer(httpx.Response(status, content=body))
        return _decode(_readiness_decoder, body, "readiness answer")

    def create_key(
        self,
        name: str,
        models: list[str],
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: datetime | None = None,
    ) -> KeyReply[KeyCreated]:
        """A new API key scoped to ``models`` (``["*"]``: every model) that works until
        ``expires_at`` (None: until revoked); the answer holds the whole key, which the
        server never shows again."""
        body: dict[str, object] = {"name": name, "models": models, "rpm": rpm, "tpm": tpm}
        if expires_at is not None:  # left out otherwise: a server older than it refuses it
            body["expires_at"] = expires_at
        raw = self.request("POST", "/admin/v1/keys", body=body)
        return KeyReply(_decode(_key_created_decoder, raw, "new key"), raw)

    def list_keys(self) -> list[ListedKey]:
        """Every API key, oldest first, read page after page, each with its JSON as the API
        sent it."""
        keys: list[ListedKey] = []
        seen: set[str] = set()
        params: dict[str, int | str] = {"limit": KEYS_PAGE_SIZE}
        for pages in itertools.count(1):
            self._check_page_count(pages, "key list", KEYS_PAGE_SIZE, "keys")
            page = self._key_page(params)
            if pages == 2 and _ids(page[: len(keys)]) == _ids(keys):
                # A server older than paging answers every key to every request, so its first
                # answer of a whole page's length is followed by the same keys again (and any
                # created since): this answer is every key.
                return page
            if (repeated := _first_repeated(page, seen)) is not None:
                raise RepeatingListing(
                    f"the admin API at {self._settings.admin_url} sent a key list page that "
                    f"repeats key {repeated}, listed already: the listing cannot be trusted "
                    "to be whole; it is not the llmgw admin API, or it is broken"
                )
            keys += page
            if len(page) != KEYS_PAGE_SIZE:
                break
            params = {"limit": KEYS_PAGE_SIZE, "after": page[-1].view.id}
        return keys

    def _key_page(self, params: Mapping[str, int | str]) -> list[ListedKey]:
        """One page of the key list: its array is split into keys as sent, and each decoded
        once."""
        raw = self.request("GET", "/admin/v1/keys", params=params)
        return [
            ListedKey(_decode(_key_decoder, key, "key list"), key)
            for key in _decode(_raw_list_decoder, raw, "key list")
        ]

    def revoke_key(self, prefix_or_name: str) -> KeyReply[KeyChange]:
        path = f"/admin/v1/keys/{segment(prefix_or_name, 'the key prefix or name')}"
        raw = self.request("DELETE", path)
        return KeyReply(_decode(_key_change_decoder, raw, "revoked key"), raw)

    def history(
        self, subject: str, key: str, *, after: int = 0, limit: int | None = None
    ) -> list[HistoryEvent]:
        """Every event about one replica, node, model or key after position ``after``,
        oldest first, reading page after page; with ``limit``, only the newest ``limit`` of
        them (read back from the newest, still returned oldest first)."""
        if subject not in HISTORY_SUBJECTS:
            raise ValueError(f"subject must be one of {', '.join(HISTORY_SUBJECTS)}")
        if limit is None:
            return list(self._iter_history(subject, key, after))
        pages: list[list[HistoryEvent]] = []
        remaining, before = limit, NEWEST
        while remaining > 0:
            self._check_page_count(len(pages) + 1, "history", HISTORY_PAGE_SIZE, "events")
            size = min(remaining, HISTORY_PAGE_SIZE)
            page = self._history_page(
                subject, key, {"after": after, "before": before, "limit": size}
            )
            if page.next_before is msgspec.UNSET:
                # A server older than `before` read on from `after`: read it all, keep the end.
                return list(deque(self._iter_history(subject, key, after), maxlen=limit))
            pages.append(_events_of(page))
            remaining -= len(page.events)
            if page.next_before is None:
                break
            if page.next_before >= before:
                raise self._stuck_cursor("next_before", page.next_before, "before", before)
            before = page.next_before
        return [event for page in reversed(pages) for event in page][-limit:]

    def _iter_history(self, subject: str, key: str, after: int) -> Iterator[HistoryEvent]:
        for pages in itertools.count(1):
            self._check_page_count(pages, "history", HISTORY_PAGE_SIZE, "events")
            page = self._history_page(subject, key, {"after": after, "limit": HISTORY_PAGE_SIZE})
            yield from _events_of(page)
            if page.next_after is None:
                return
            if page.next_after <= after:
                raise self._stuck_cursor("next_after", page.next_after, "after", after)
            after = page.next_after

    def _check_page_count(self, page: int, what: str, size: int, items: str) -> None:
        """An ``EndlessListing`` when ``page`` of a listing would be one past ``MAX_PAGES``."""
        if page > MAX_PAGES:
            raise EndlessListing(
                f"the admin API at {self._settings.admin_url} was still sending {what} "
                f"pages after {MAX_PAGES:,} of them ({MAX_PAGES * size:,} {items}): stopped "
                f"reading; it is not the llmgw admin API, or it is broken; check "
                f"{SETTING_ENV['admin_url']}"
            )

    def _stuck_cursor(self, given: str, value: int, asked: str, was: int) -> EndlessListing:
        """A history page's cursor that does not move on from the position asked for: the
        next page asked for would be this one again."""
        return EndlessListing(
            f"the admin API at {self._settings.admin_url} sent a history page whose {given} "
            f"({value}) does not move on from the {asked} asked for ({was}): stopped reading, "
            f"as it would send pages for ever; it is not the llmgw admin API, or it is broken"
        )

    def _history_page(self, subject: str, key: str, params: Mapping[str, int]) -> HistoryPage:
        body = self._get(
            f"/admin/v1/history/{subject}/{segment(key, _HISTORY_KEYS[subject])}", params
        )
        return _decode(_page_decoder, body, "history page")

    def _get(self, path: str, params: Mapping[str, int | str]) -> bytes:
        return self.request("GET", path, params=params)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, int | str] | None = None,
        body: object = None,
    ) -> bytes:
        """One call of the admin API (``body``, if any, sent as JSON); the answer's body."""
        content = None if body is None else msgspec.json.encode(body)
        headers = {"content-type": "application/json"} if content is not None else None
        status, answer = self._exchange(method, path, params, content, headers)
        if 200 <= status < 300:
            return answer
        raise self._error_answer(httpx.Response(status, content=answer))

    def _exchange(
        self,
        method: str,
        path: str,
        params: Mapping[str, int | str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One request; the answer's status and whole body, within the time and size
        bounds."""
        deadline = time.monotonic() + self._answer_within_s
        try:
            with self._http.stream(
                method, path, params=dict(params or {}), content=content, headers=headers
            ) as streamed:
                return streamed.status_code, self._whole_body(streamed, deadline)
        except httpx.TransportError as exc:
            raise self._transport_failure(exc) from exc

    def _whole_body(self, streamed: httpx.Response, deadline: float) -> bytes:
        declared = streamed.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self._max_answer_bytes:
            raise self._too_large(streamed, "an answer")
        answer = bytearray()
        for chunk in streamed.iter_bytes():
            answer += chunk
            if len(answer) > self._max_answer_bytes:
                raise self._too_large(streamed, "an answer")
            if time.monotonic() > deadline:
                raise self._too_slow()
        return bytes(answer)

    def _too_large(self, streamed: httpx.Response, what: str) -> ClientError:
        request = streamed.request
        return AnswerTooLarge(
            f"the admin API at {self._settings.admin_url} sent {what} over "
            f"{size_words(self._max_answer_bytes)}, the most llmgw-cli reads "
            f"({request.method} {request.url}): it is not the llmgw admin API, or it (or a "
            f"proxy in front of it) is broken; check {SETTING_ENV['admin_url']}"
        )

    def _too_slow(self) -> ClientError:
        return AdminUnreachable(
            f"the admin API at {self._settings.admin_url} sent no whole answer within "
            f"{self._answer_within_s:g} s: it, or a proxy in front of it, is stalling; "
            "try again, and if it persists check the server's log"
        )

    def stream_lines(
        self,
        path: str,
        params: Mapping[str, int | str],
        *,
        headers: Mapping[str, str] | None = None,
        idle_timeout_s: float = 60.0,
    ) -> Iterator[str]:
        """The lines of a streamed answer as they arrive, until the server ends it; a
        ``ClientError`` when no line came for ``idle_timeout_s``, the connection broke, or
        one record (the lines up to a blank one: an event-stream message) passed the
        bound of an answer."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=idle_timeout_s)
        try:
            with self._http.stream(
                "GET", path, params=dict(params), headers=headers, timeout=timeout
            ) as response:
                if not response.is_success:
                    deadline = time.monotonic() + self._answer_within_s
                    body = self._whole_body(response, deadline)
                    raise self._error_answer(httpx.Response(response.status_code, content=body))
                lines = BoundedLines(self._max_answer_bytes)
                for chunk in response.iter_bytes():
                    try:
                        complete = lines.feed(chunk)
                    except RecordTooLarge:
                        raise self._too_large(response, "a streamed record") from None
                    yield from complete
                yield from lines.finish()
        except httpx.TransportError as exc:
            raise self._transport_failure(exc) from exc

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
            if self._url.scheme == "https":
                # An asyncio TLS server that rejects a client certificate drops the
                # connection without a TLS alert: all this side sees is the cut.
                return TlsFailure(
                    f"TLS with the admin API at {url} failed: the server closed the connection "
                    f"without answering; {self._refused_certificate_advice()}"
                )
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

    def _cut_off_advice(self) -> str:
        return "does the URL's scheme (http or https) match the server's?"

    def _refused_certificate_advice(self) -> str:
        certificate = self._settings.client_cert
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
        host = self._url.host
        port = self._url.port or 443
        verification_failed = _in_chain(exc, ssl.SSLCertVerificationError) is not None
        presented = fetch_presented_certificate(host, port) if verification_failed else None
        return explain_tls_failure(exc, host, presented)

    def _error_answer(self, response: httpx.Response) -> ClientError:
        if response.status_code == 401:
            return AuthenticationRequired(self._authentication_advice())
        document = _problem_document(response.content)
        problem = _converted(document, Problem) or Problem()
        detail = problem.detail or problem.title
        if not detail:
            detail = (
                f"{self._settings.admin_url} answered HTTP {response.status_code} "
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

    def _authentication_advice(self) -> str:
        config = self._settings.config_file or "the config file"
        where = f"set {SETTING_ENV['token']} (or pass --token, or set token in {config})"
        if self._url.scheme == "https" and self._settings.client_cert is None:
            where += (
                f", or present an operator certificate: set {SETTING_ENV['client_cert']} and "
                f"{SETTING_ENV['client_key']} (`llmgw-cli cert operator <name>` issues one)"
            )
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


def _events_of(page: HistoryPage) -> list[HistoryEvent]:
    return [
        HistoryEvent(view=_decode(_event_decoder, raw, "event"), raw=raw) for raw in page.events
    ]


def _ids(keys: list[ListedKey]) -> list[str]:
    return [key.view.id for key in keys]


def _first_repeated(page: list[ListedKey], seen: set[str]) -> str | None:
    """The id of the first key of ``page`` that ``seen`` or ``page`` itself holds already,
    None when there is none; ``seen`` takes the ids up to it."""
    for key in page:
        if key.view.id in seen:
            return key.view.id
        seen.add(key.view.id)
    return None


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes, what: str) -> _T:
    try:
        return decoder.decode(body)
    except UNREADABLE as exc:
        raise ApiProblem(
            200, f"the admin API sent a {what} this client cannot read: {exc}"
        ) from exc


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
