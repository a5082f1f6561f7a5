"""Answer heads as bytes (``app.listeners.http11``): framing, the connection's fate, and
heads an app cannot smuggle a line into; request heads whose framing a proxy in front could
read otherwise; empty lines before a request, dropped; and the heap settling a started
server does."""

from __future__ import annotations

import gc

import pytest

from app.listeners.heap import GEN0_THRESHOLD, settle_heap
from app.listeners.http11 import (
    InvalidAnswer,
    answer_head,
    chunk,
    framing_refusal,
    skip_empty_lines,
    split_target,
)


def test_an_answer_with_a_length_keeps_the_connection_and_is_not_chunked() -> None:
    head = answer_head(200, [(b"content-length", b"2")], keep_alive=True, bodiless=False)

    assert head.data == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    assert (head.chunked, head.content_length, head.keep_alive) == (False, 2, True)


def test_an_answer_without_a_length_is_chunked_or_for_http_1_0_ended_by_the_close() -> None:
    chunked = answer_head(200, [], keep_alive=True, bodiless=False)
    unframed = answer_head(200, [], keep_alive=True, bodiless=False, chunkable=False)

    assert chunked.data.endswith(b"transfer-encoding: chunked\r\n\r\n")
    assert chunked.chunked
    assert chunked.keep_alive
    assert not unframed.chunked
    assert unframed.content_length == -1
    assert not unframed.keep_alive
    assert unframed.data.endswith(b"connection: close\r\n\r\n")


def test_connection_close_is_said_once_whoever_asks_for_it() -> None:
    by_app = answer_head(200, [(b"connection", b"close")], keep_alive=True, bodiless=True)
    by_server = answer_head(204, [], keep_alive=False, bodiless=False)

    assert by_app.data.count(b"connection: close") == 1
    assert not by_app.keep_alive
    assert by_server.data == b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"


@pytest.mark.parametrize("value", [b"a\r\nset-cookie: x", b"a\nb", b"a\rb", b"a\0b"])
def test_a_header_with_a_line_break_in_it_is_refused(value: bytes) -> None:
    with pytest.raises(InvalidAnswer):
        answer_head(200, [(b"x-engine", value)], keep_alive=True, bodiless=False)


def test_chunks_frame_their_body_and_the_last_one_ends_the_answer() -> None:
    assert chunk(b"hello", last=False) == b"5\r\nhello\r\n"
    assert chunk(b"", last=False) == b""
    assert chunk(b"hi", last=True) == b"2\r\nhi\r\n0\r\n\r\n"


def test_a_target_splits_into_its_decoded_path_raw_path_and_query() -> None:
    assert split_target(b"/v1/a%20b?x=1#frag") == ("/v1/a b", b"/v1/a%20b", b"x=1")
    assert split_target(b"http://host:80/p?q") == ("/p", b"/p", b"q")


@pytest.mark.parametrize(
    ("version", "hosts", "transfer_encoding", "status", "says"),
    [
        ("0.9", 0, None, 505, "HTTP/0.9 is not served"),
        ("2.0", 1, None, 505, "HTTP/2.0 is not served"),
        ("1.1", 0, None, 400, "one Host header, not 0"),
        ("1.1", 2, None, 400, "one Host header, not 2"),
        ("1.0", 0, b"chunked", 400, "not allowed in an HTTP/1.0 request"),
        ("1.1", 1, b"identity, chunked", 400, "`identity, chunked` is not served"),
        ("1.1", 1, b"chunked, identity", 400, "`chunked, identity` is not served"),
        ("1.1", 1, b"xchunked", 400, "`xchunked` is not served"),
        ("1.1", 1, b"gzip", 400, "`gzip` is not served"),
    ],
)
def test_a_head_a_proxy_could_frame_otherwise_is_refused_naming_why(
    version: str, hosts: int, transfer_encoding: bytes | None, status: int, says: str
) -> None:
    refusal = framing_refusal(version, hosts=hosts, transfer_encoding=transfer_encoding)

    assert refusal is not None
    assert refusal[0] == status
    assert says in refusal[1]


@pytest.mark.parametrize(
    ("version", "hosts", "transfer_encoding"),
    [
        ("1.1", 1, None),
        ("1.1", 1, b"chunked"),
        ("1.1", 1, b"ChUnKeD"),  # a coding's name is case-insensitive (RFC 9112, 7)
        ("1.1", 1, b"chunked \t"),
        ("1.0", 0, None),  # HTTP/1.0 has no Host to require
        ("1.0", 2, None),
    ],
)
def test_a_head_framed_one_way_only_is_served(
    version: str, hosts: int, transfer_encoding: bytes | None
) -> None:
    assert framing_refusal(version, hosts=hosts, transfer_encoding=transfer_encoding) is None


def test_empty_lines_before_a_request_are_dropped_and_nothing_after_them() -> None:
    assert skip_empty_lines(b"\r\n\r\n\n\rGET / HTTP/1.1\r\n\r\n") == b"GET / HTTP/1.1\r\n\r\n"
    assert skip_empty_lines(b"\r\n" * 50_000) == b""
    assert skip_empty_lines(b"GET /\r\n\r\n") == b"GET /\r\n\r\n"


def test_a_settled_heap_is_frozen_and_collects_its_young_objects_rarely() -> None:
    thresholds = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GEN0_THRESHOLD, thresholds[1], thresholds[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
