"""Free text an operator sends for the log to keep (a cordon's, a pause's or a revocation's
reason, the strings of a bench summary): what it may hold. Pure.

A NUL cannot be recorded at all: PostgreSQL's text and jsonb hold none, so the log would
keep U+FFFD in its place and read back something else than was sent. The other C0 control
characters (and DEL) are refused too: the text is shown in tables, log lines and the agent
hub's refusals, where an escape sequence would rewrite the terminal and a line break would
forge a line. A field where several lines make sense says which it allows.
"""

from __future__ import annotations

import functools
import re

from app.domain.model_spec import SpecError

MAX_REASON_LENGTH = 500
"""The most characters of a reason (a cordon's, a pause's, a revocation's): a line or two
that tables and log lines show whole."""
LINES = "\t\n"
"""What a field of several lines allows: tabs and line feeds (a CR is still refused)."""


def control_character_errors(field: str, text: str, *, allowed: str = "") -> list[SpecError]:
    """``field``'s error when ``text`` holds a C0 control character or DEL that ``allowed``
    does not list; none when it holds none."""
    found = _control_characters(allowed).search(text)
    if found is None:
        return []
    character, index = found.group(), found.start()
    if character == "\0":
        why = "the log cannot hold a NUL"
    elif allowed:
        why = "of the control characters only tabs and line feeds may be sent"
    else:
        why = "it must be one line of text"
    where = f"U+{ord(character):04X} (character {index + 1})"
    return [SpecError(field, f"holds the control character {where}: {why}")]


@functools.cache
def _control_characters(allowed: str) -> re.Pattern[str]:
    """C0 control characters and DEL, less ``allowed``: one search in C, not a loop in
    Python over every character of a text that may be a megabyte long."""
    refused = "".join(chr(c) for c in (*range(0x20), 0x7F) if chr(c) not in allowed)
    return re.compile(f"[{re.escape(refused)}]")


def reason_errors(field: str, text: str) -> list[SpecError]:
    """``field``'s error when ``text`` is no one-line reason of at most
    ``MAX_REASON_LENGTH`` characters; none when it is one."""
    if len(text) > MAX_REASON_LENGTH:
        return [SpecError(field, f"at most {MAX_REASON_LENGTH} characters, not {len(text)}")]
    return control_character_errors(field, text)
