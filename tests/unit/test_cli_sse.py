"""Reading an event stream as the HTML standard says, line by line."""

from __future__ import annotations

from cli.sse import SseMessage, SseParser


def feed(parser: SseParser, text: str) -> list[SseMessage]:
    return [m for line in text.split("\n") if (m := parser.feed(line)) is not None]


def test_a_message_is_its_data_lines_joined_with_the_last_id_seen() -> None:
    parser = SseParser()

    messages = feed(parser, ": opening comment\nretry: 2000\n\nid: 7\ndata: {\ndata:  }\n\n")

    assert messages == [SseMessage(data="{\n }", id="7")]


def test_the_id_carries_over_to_later_messages_until_another_is_sent() -> None:
    parser = SseParser()

    messages = feed(parser, "id: 3\ndata: a\n\ndata: b\n\nid: 4\nevent: ping\ndata: c\n\n")

    assert [(m.data, m.id, m.event) for m in messages] == [
        ("a", "3", "message"),
        ("b", "3", "message"),
        ("c", "4", "ping"),
    ]


def test_comments_and_blocks_without_data_dispatch_nothing_but_an_id_is_kept() -> None:
    parser = SseParser()

    messages = feed(parser, ": keepalive\n\nid: 9\n\n")

    assert messages == []
    assert parser.last_id == "9"


def test_an_id_with_a_null_is_ignored() -> None:
    parser = SseParser()

    feed(parser, "id: 5\n\nid: 6\0\n\n")

    assert parser.last_id == "5"
