"""HTTP/1.1 answers as bytes: pure helpers of the listeners' server (``httpserver``).

No socket and no loop here: a status and headers in, the bytes of an answer's head out,
with what the head says about the body's framing and the connection's fate.

    head = answer_head(200, [(b"content-length", b"2")], keep_alive=True, bodiless=False)
    head.data          # b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\n"
    head.chunked       # False: the body goes as it is, ``head.content_length`` bytes
    head.keep_alive    # True: the connection serves the next request afterwards

And the other way, what a request's head says that the server will not read one way while
something in front of it (a proxy, a load balancer) may read it another:

    framing_refusal("1.1", hosts=1, transfer_encoding=b"gzip, chunked")
    # (400, "Transfer-Encoding `gzip, chunked` is not served: only `chunked` is.")
"""

from __future__ import annotations

import http
import math
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import unquote

import httptools

Header = tuple[bytes, bytes]

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"
_CONNECTION_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
BODILESS_STATUSES = frozenset({204, 304})
"""Answers that never have a body, so carry no ``content-length`` of one."""
_SERVED_VERSIONS = frozenset({"1.0", "1.1"})
_EMPTY_LINE_BYTES = b"\r\n"


class InvalidAnswer(RuntimeError):
    """The application asked for an answer HTTP cannot carry (a bad header, a body longer
    or shorter than its length)."""


@lru_cache(maxsize=128)
def status_line(status: int) -> bytes:
    """``HTTP/1.1 200 OK\\r\\n``; a status Python does not know gets no reason phrase."""
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


class AnswerHead:
    """An answer's head as bytes, and how its body is framed."""

    __slots__ = ("chunked", "content_length", "data", "keep_alive")

    def __init__(
        self, data: bytes, *, chunked: bool, content_length: int, keep_alive: bool
    ) -> None:
        self.data = data
        self.chunked = chunked
        self.content_length = content_length
        """The body's length for a body that is not chunked (0 for a bodiless answer, -1
        for one that ends when the connection closes)."""
        self.keep_alive = keep_alive


def answer_head(
    status: int,
    headers: Iterable[Header],
    *,
    keep_alive: bool,
    bodiless: bool,
    chunkable: bool = True,
) -> AnswerHead:
    """The head of an answer with ``headers`` (names in lower case, as an ASGI app sends
    them). ``keep_alive``: whether the connection may serve another request (a
    ``connection: close`` header says no); ``bodiless``: the answer to a HEAD request.
    Without ``content-length`` the body is chunked, or, where the client cannot read
    chunks (``chunkable`` false: HTTP/1.0), sent as it is and ended by closing the
    connection. Raises ``InvalidAnswer``."""
    lines = [status_line(status)]
    content_length: int | None = None
    chunked = False
    said_close = False
    for name, value in headers:
        if name == b"content-length":
            if content_length is None and not chunked:
                content_length = int(value)
        elif name == b"transfer-encoding":
            if value.lower() == b"chunked":
                chunked = True
                content_length = None
        elif name == b"connection" and b"close" in value.lower():
            keep_alive = False
            said_close = True
        lines.append(b"%s: %s\r\n" % (name, value))
    unframed = content_length is None and not bodiless and status not in BODILESS_STATUSES
    if unframed and not chunked and not chunkable:
        keep_alive = False  # the body ends where the connection does
    if not keep_alive and not said_close:
        lines.append(_CONNECTION_CLOSE)
    if unframed and not chunked and chunkable:
        chunked = True
        lines.append(_CHUNKED)
    lines.append(b"\r\n")
    data = b"".join(lines)
    # One line per header and no other line break: a value or name with CR, LF or NUL in
    # it would split the head (response splitting). Counting in C beats a regex per header.
    if data.count(b"\n") != len(lines) or data.count(b"\r") != len(lines) or b"\0" in data:
        raise InvalidAnswer("a header name or value holds CR, LF or NUL")
    return AnswerHead(
        data,
        chunked=chunked and not bodiless,
        content_length=0 if bodiless else -1 if unframed and not chunked else content_length or 0,
        keep_alive=keep_alive,
    )


def chunk(body: bytes, *, last: bool) -> bytes:
    """``body`` as one chunk of a chunked body (nothing for an empty one), and the last
    chunk after it when ``last``."""
    if not body:
        return LAST_CHUNK if last else b""
    framed = b"%x\r\n%s\r\n" % (len(body), body)
    return framed + LAST_CHUNK if last else framed


def closing_answer(
    status: int, content_type: bytes, body: bytes, retry_after_s: float | None = None
) -> bytes:
    """A whole answer after which the connection closes (a refusal, a 400, a 500);
    ``retry_after_s``: when the client may try again (``Retry-After``)."""
    retry_after = (
        b""
        if retry_after_s is None
        else b"retry-after: %s\r\n" % (retry_after_header(retry_after_s))
    )
    return b"%scontent-type: %s\r\ncontent-length: %d\r\n%sconnection: close\r\n\r\n%s" % (
        status_line(status),
        content_type,
        len(body),
        retry_after,
        body,
    )


def retry_after_header(seconds: float) -> bytes:
    """``Retry-After`` takes whole seconds; round up so a client never comes back early."""
    return b"%d" % max(1, math.ceil(seconds))


def framing_refusal(
    version: str, *, hosts: int, transfer_encoding: bytes | None
) -> tuple[int, str] | None:
    """The status and message refusing a request whose head the server could read one way
    and a proxy in front of it another (request smuggling), or None for one it reads one
    way only. httptools refuses the rest already (``Content-Length`` with
    ``Transfer-Encoding``, two lengths, bare line ends, a space before a colon); it lets
    these through:

    - a version but 1.0 and 1.1 (``GET /`` without one is HTTP/0.9): 505;
    - an HTTP/1.1 request with no ``Host``, or more than one (RFC 9112, 3.2): 400;
    - a ``Transfer-Encoding`` on an HTTP/1.0 request, whose framing RFC 9112 (6.1) says
      is faulty, or one that is not ``chunked`` alone (``identity, chunked``,
      ``xchunked``, ``gzip``): no other coding is served, and one a proxy knows and
      this server does not frames the body differently for each: 400.
    """
    if version not in _SERVED_VERSIONS:
        return 505, f"HTTP/{version} is not served here: send HTTP/1.1."
    if version == "1.1" and hosts != 1:
        return 400, f"An HTTP/1.1 request carries one Host header, not {hosts}."
    if transfer_encoding is None:
        return None
    if version == "1.0":
        return 400, "Transfer-Encoding is not allowed in an HTTP/1.0 request."
    if transfer_encoding.strip(b" \t").lower() != b"chunked":
        coding = transfer_encoding[:100].decode("latin-1")
        return 400, f"Transfer-Encoding `{coding}` is not served: only `chunked` is."
    return None


def skip_empty_lines(data: bytes) -> bytes:
    """``data``, read where a request would begin, without the empty lines it begins with:
    RFC 9112 (2.2) has a server ignore empty lines (CRLF) before a request-line, and
    httptools skips them, a lone CR or LF too. Dropped as they arrive, before the parser,
    they take no memory and count towards no head, however many come."""
    return data.lstrip(_EMPTY_LINE_BYTES)


def split_target(target: bytes) -> tuple[str, bytes, bytes]:
    """A request target's path (percent-decoded, as ASGI's ``path``), its raw path and its
    query string. Raises ``httptools.HttpParserInvalidURLError`` or ``UnicodeDecodeError``
    for a target that is not one."""
    if target[:1] == b"/":
        raw_path, _, query = target.partition(b"?")
        query = query.partition(b"#")[0]
        raw_path = raw_path.partition(b"#")[0]
    else:  # absolute form (http://host/path), or "*"
        parsed = httptools.parse_url(target)
        raw_path, query = parsed.path or b"/", parsed.query or b""
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    return path, raw_path, query
