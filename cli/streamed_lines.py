"""A streamed answer of the admin API (``events --follow``'s event stream) read line by
line as it arrives, each record within the bound of an answer, each pause within an idle
timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import httpx

from cli.bounded_lines import BoundedLines, RecordTooLarge
from cli.client import AdminClient


def stream_lines(
    client: AdminClient,
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
    timeout = httpx.Timeout(client.http.timeout.connect, read=idle_timeout_s)
    try:
        with client.http.stream(
            "GET", path, params=dict(params), headers=headers, timeout=timeout
        ) as response:
            if not response.is_success:
                deadline = time.monotonic() + client.answer_within_s
                body = client.whole_body(response, deadline)
                raise client.error_answer(httpx.Response(response.status_code, content=body))
            lines = BoundedLines(client.max_answer_bytes)
            for chunk in response.iter_bytes():
                try:
                    complete = lines.feed(chunk)
                except RecordTooLarge:
                    raise client.too_large(response, "a streamed record") from None
                yield from complete
            yield from lines.finish()
    except httpx.TransportError as exc:
        raise client.transport_failure(exc) from exc
