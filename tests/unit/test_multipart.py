"""The sans-I/O multipart reader: the same events however the body is cut into pieces."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire.multipart import (
    MAX_PART_HEADER_BYTES,
    BodyEnded,
    Event,
    MalformedMultipart,
    MultipartReader,
    PartData,
    PartEnded,
    PartStarted,
    boundary_of,
)

BOUNDARY = b"----llmgw-test-boundary"
FILE = bytes(range(256)) * 40 + b"\r\n--almost-a-boundary\r\n" + b"\r\n------llmgw-test"


def form(*parts: tuple[str, str | None, bytes], boundary: bytes = BOUNDARY) -> bytes:
    body = b"preamble to ignore\r\n"
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        body += b"--" + boundary + b"\r\n"
        body += f"Content-Disposition: {disposition}\r\n".encode()
        if filename is not None:
            body += b"Content-Type: audio/wav\r\n"
        body += b"\r\n" + content + b"\r\n"
    return body + b"--" + boundary + b"--\r\nepilogue"


BODY = form(("model", None, b"whisper"), ("file", "a b.wav", FILE), ("language", None, b"en"))


def read(pieces: list[bytes]) -> list[Event]:
    reader = MultipartReader(BOUNDARY)
    events: list[Event] = []
    for piece in pieces:
        events += reader.feed(piece)
    reader.finish()
    return events


def parts_of(events: list[Event]) -> list[tuple[str, str | None, bytes]]:
    """The events folded back into (name, filename, content) and checked for order."""
    parts: list[tuple[str, str | None, bytes]] = []
    current: PartStarted | None = None
    content = b""
    for event in events:
        if isinstance(event, PartStarted):
            assert current is None
            current, content = event, b""
        elif isinstance(event, PartData):
            assert current is not None
            content += event.data
        elif isinstance(event, PartEnded):
            assert current is not None
            parts.append((current.name, current.filename, content))
            current = None
    assert isinstance(events[-1], BodyEnded)
    return parts


EXPECTED = [("model", None, b"whisper"), ("file", "a b.wav", FILE), ("language", None, b"en")]


def test_a_whole_form_in_one_piece() -> None:
    events = read([BODY])
    assert parts_of(events) == EXPECTED
    started = [e for e in events if isinstance(e, PartStarted)]
    assert started[1].content_type == "audio/wav"


def test_a_form_fed_byte_by_byte_reads_the_same() -> None:
    assert parts_of(read([BODY[i : i + 1] for i in range(len(BODY))])) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(BODY)), max_size=12))
def test_a_form_cut_anywhere_reads_the_same(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(BODY)]
    pieces = [BODY[a:b] for a, b in itertools.pairwise(points)]
    assert parts_of(read(pieces)) == EXPECTED


def test_the_reader_keeps_no_more_than_a_boundary_of_a_file() -> None:
    reader = MultipartReader(BOUNDARY)
    reader.feed(
        b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\n'
    )
    passed = 0
    for _ in range(100):
        passed += sum(len(e.data) for e in reader.feed(b"x" * 65536) if isinstance(e, PartData))
    # Everything but what could be the start of the next boundary has been handed over.
    assert 100 * 65536 - passed < len(BOUNDARY) + 4


def test_a_body_that_stops_before_its_closing_boundary_is_malformed() -> None:
    reader = MultipartReader(BOUNDARY)
    reader.feed(BODY[:-40])
    with pytest.raises(MalformedMultipart, match="closing boundary"):
        reader.finish()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"--" + BOUNDARY + b"\r\nX-Other: 1\r\n\r\nx\r\n", "no Content-Disposition"),
        (b"--" + BOUNDARY + b"\r\nno colon here\r\n\r\nx\r\n", "no colon"),
        (
            b"--" + BOUNDARY + b"\r\nContent-Disposition: attachment; name=a\r\n\r\n",
            "not form-data",
        ),
        (b"--" + BOUNDARY + b"garbage\r\n", "other text"),
        (b"--" + BOUNDARY + b"\r\nX: " + b"y" * MAX_PART_HEADER_BYTES, "headers exceed"),
    ],
)
def test_malformed_parts_are_named(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedMultipart, match=reason):
        MultipartReader(BOUNDARY).feed(body)


def test_boundaries_are_read_from_the_content_type() -> None:
    assert boundary_of("multipart/form-data; boundary=abc") == b"abc"
    assert boundary_of('Multipart/Form-Data; charset=utf-8; boundary="a b:c"') == b"a b:c"
    with pytest.raises(MalformedMultipart, match="must be multipart/form-data"):
        boundary_of("application/json")
    with pytest.raises(MalformedMultipart, match="must be multipart/form-data, not none"):
        boundary_of("")
    with pytest.raises(MalformedMultipart, match="names no boundary"):
        boundary_of("multipart/form-data")
    with pytest.raises(MalformedMultipart, match="longer than 70"):
        boundary_of("multipart/form-data; boundary=" + "b" * 71)
