"""A UTF-8 byte order mark before a JSON body, skipped: once, and only at the very start.

RFC 8259 (section 8.1) forbids a JSON text to begin with one but lets a reader ignore it,
and some Windows clients and tools write one (Windows PowerShell's ``-Encoding UTF8``, a
file saved as "UTF-8 with BOM" and sent with ``curl --data-binary @file``). Left in, every
strict reader refuses the body as not valid JSON. The gateway (``app.gateway.request_body``)
and the admin API (``app.admin.bodies``) skip it where the body enters, so that nothing past
them, the engine a body is forwarded to included, ever sees one.

A body arrives in pieces, and the mark may be split across them (a client that writes it on
its own, then its JSON): ``LeadingMark`` holds back the first few bytes until it can tell.
Only the piece that holds the mark is copied, never the body whole. A second mark, or one
after anything else (whitespace included), is left where it is: the body is not JSON.
"""

from __future__ import annotations

UTF8_BOM = b"\xef\xbb\xbf"


def without_mark(body: bytes) -> bytes:
    """``body`` without a leading byte order mark (the same object when it has none)."""
    return body[len(UTF8_BOM) :] if body.startswith(UTF8_BOM) else body


class LeadingMark:
    """Skips a byte order mark at the start of a body fed in order, piece by piece."""

    __slots__ = ("_held", "_settled")

    def __init__(self) -> None:
        self._held = b""
        self._settled = False

    def feed(self, piece: bytes, *, more: bool) -> bytes:
        """What of the body to pass on for ``piece`` (``more``: pieces follow): ``piece``
        itself once the start is settled; until then, what it and the pieces held back
        make, the mark left out."""
        if self._settled:
            return piece
        start = self._held + piece if self._held else piece
        if more and len(start) < len(UTF8_BOM) and UTF8_BOM.startswith(start):
            self._held = start  # maybe the start of a mark: the next piece tells
            return b""
        self._held = b""
        self._settled = True
        return without_mark(start)
