"""What the operator typed, checked before it is used: a count is a whole number, a name or
id in a request path is one whole path segment, a span of time has a unit, a moment says
its timezone. Each refusal is a usage error (exit 2) whose message names the argument.

    UsageError           the command cannot work as called (exit 2), from a command
    ArgumentRefused      a value cyclopts could convert but this CLI refuses; cyclopts
                         reports it as ``--max must be a whole number, got 2.5``,
                         ``--grace must be a finite number, got inf`` or ``--model
                         cannot be empty``
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

from cyclopts import Token


class UsageError(Exception):
    """The command was called in a way it cannot work (exit code 2)."""


class ArgumentRefused(ValueError):
    """A value refused by a converter; the message follows the argument's name."""


MAX_REPLICAS = 10_000
"""The most replicas a model may be scaled to, or autoscale between: the admin API refuses
more. The CLI cannot import the domain's bound, so it is written again (a test holds the two
equal) and checked before anything is sent."""

MAX_REASON_LENGTH = 500
"""The most characters of a reason sent for the log (a rollout's pause, a node's cordon, a
certificate's revocation): the admin API refuses more. Written again, as ``MAX_REPLICAS``
is (a test holds the two equal)."""

_CONTROL = re.compile("[\x00-\x1f\x7f]")
"""C0 control characters and DEL, which the admin API refuses in a one-line reason."""

_WHOLE = re.compile(r"[+-]?[0-9]+")
"""Decimal digits, ASCII only, with an optional sign: what every program of llmgw takes for a
whole number (``app.usage_words``, which the CLI does not import; a test holds the two
equal)."""
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def whole_number(_type: object, tokens: Sequence[Token]) -> int:
    """cyclopts' converter for every ``int`` argument and option: ``4`` in decimal digits,
    never ``4.0``, a fraction, ``1e3``, ``0x10`` or ``1_0``. cyclopts' own rounds ``2.5`` to
    2 and ``0.6`` to 1, a count the operator did not ask for; and ``4.0``, which the other
    programs refuse, would be a whole number here only."""
    text = tokens[0].value.strip()
    if not _WHOLE.fullmatch(text):
        raise ArgumentRefused(f"must be a whole number, got {tokens[0].value}")
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4300)
        raise ArgumentRefused(f"must be a whole number, got {len(text)} digits") from None


def finite_number(_type: object, tokens: Sequence[Token]) -> float:
    """cyclopts' converter for every ``float`` argument and option: a number, never
    ``inf`` or ``nan``. JSON has neither: sent, one would arrive as null, which the API reads
    as the field's default. Nor ``1_0`` or digits of another script, which ``float`` reads
    as 10 and as their value."""
    try:
        number = float(tokens[0].value)
    except ValueError:
        raise ArgumentRefused(f"must be a number, got {tokens[0].value}") from None
    if not math.isfinite(number):
        raise ArgumentRefused(f"must be a finite number, got {tokens[0].value}")
    if not _DECIMAL.fullmatch(tokens[0].value.strip()):
        raise ArgumentRefused(f"must be a number in decimal digits, got {tokens[0].value}")
    return number


def one_line_reason(_type: object, tokens: Sequence[Token]) -> str:
    """cyclopts' converter for a ``--reason`` the log keeps (a rollout's pause, a node's
    cordon): one line of at most ``MAX_REASON_LENGTH`` characters, as the admin API takes
    one, so a longer one or one holding a control character (an escape sequence, a line
    break) is bad usage, not a refusal from the API."""
    return _checked_reason(tokens[0].value)


def stripped_one_line_reason(_type: object, tokens: Sequence[Token]) -> str:
    """cyclopts' converter for a ``--reason`` the admin API strips before it checks it (a
    certificate's revocation): ``one_line_reason`` of what is left, which is what is sent.
    A trailing line break or blanks past the bound are not refused, as the API takes them."""
    return _checked_reason(tokens[0].value.strip())


def _checked_reason(reason: str) -> str:
    if len(reason) > MAX_REASON_LENGTH:
        raise ArgumentRefused(f"must be at most {MAX_REASON_LENGTH} characters, got {len(reason)}")
    found = _CONTROL.search(reason)
    if found is not None:
        raise ArgumentRefused(
            f"must be one line of text, got the control character U+{ord(found.group()):04X} "
            f"(character {found.start() + 1})"
        )
    return reason


class WholeNumberWithin:
    """cyclopts' converter for an ``int`` option bounded as the admin API bounds it:
    ``whole_number``, from ``low`` to ``high`` (or with no upper bound, when ``high`` is
    ``None``); past them, refused in the CLI's words (``--max-step must be from 1 to 10000,
    got 0``, ``--requests must be at least 1, got 0``), not cyclopts'."""

    def __init__(self, low: int, high: int | None = None) -> None:
        self.low = low
        self.high = high

    def __call__(self, type_: object, tokens: Sequence[Token]) -> int:
        number = whole_number(type_, tokens)
        if number < self.low or (self.high is not None and number > self.high):
            raise ArgumentRefused(f"must be {self._span()}, got {tokens[0].value}")
        return number

    def _span(self) -> str:
        """``from 1 to 10000``, or ``at least 1``."""
        if self.high is None:
            return f"at least {self.low}"
        return f"from {self.low} to {self.high}"


class NumberWithin:
    """cyclopts' converter for a ``float`` option bounded as the admin API bounds it:
    ``finite_number``, from ``low`` (above it, with ``above_low``) to ``high`` (or with no
    upper bound, when ``high`` is ``None``); past them, refused in the CLI's words
    (``--capacity must be from 0.01 to 1, got 2.5``, ``--grace must be above 0, got 0``)."""

    def __init__(self, low: float, high: float | None = None, *, above_low: bool = False) -> None:
        self.low = low
        self.high = high
        self.above_low = above_low

    def __call__(self, type_: object, tokens: Sequence[Token]) -> float:
        number = finite_number(type_, tokens)
        too_low = number <= self.low if self.above_low else number < self.low
        if too_low or (self.high is not None and number > self.high):
            raise ArgumentRefused(f"must be {self._span()}, got {tokens[0].value}")
        return number

    def _span(self) -> str:
        """``from 0 to 86400``, ``above 0 and at most 3600``, ``above 0``, ``at least 1``."""
        if self.high is None:
            return f"above {self.low:g}" if self.above_low else f"at least {self.low:g}"
        low = f"above {self.low:g} and at most" if self.above_low else f"from {self.low:g} to"
        return f"{low} {self.high:g}"


_DURATION = re.compile(r"^([0-9]+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(_type: object, tokens: Sequence[Token]) -> timedelta:
    """cyclopts' converter for a span of time: a whole number and a unit, ``s``, ``m``,
    ``h``, ``d`` or ``w`` (``90m``, ``12h``, ``30d``, ``2w``)."""
    match = _DURATION.match(tokens[0].value.strip())
    if not match:
        raise ArgumentRefused(
            "must be a whole number and a unit (s, m, h, d or w), such as 90m, 12h, 30d or "
            f"2w, got {tokens[0].value}"
        )
    try:
        return timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])
    except OverflowError:
        raise ArgumentRefused(f"is too long, got {tokens[0].value}") from None


def moment(_type: object, tokens: Sequence[Token]) -> datetime:
    """cyclopts' converter for a point in time: ISO 8601 with its timezone
    (``2027-01-31T00:00:00Z``, ``2027-01-31T09:00:00+09:00``). Without one, the time would
    be read in whichever zone the machine sending it is set to."""
    try:
        at = datetime.fromisoformat(tokens[0].value.strip())
    except ValueError:
        raise ArgumentRefused(
            f"must be an ISO 8601 time such as 2027-01-31T00:00:00Z, got {tokens[0].value}"
        ) from None
    if at.utcoffset() is None:
        raise ArgumentRefused(
            f"must say its timezone (such as Z or +02:00 at the end), got {tokens[0].value}"
        )
    return at


def filled(_type: object, tokens: Sequence[Token]) -> str:
    """cyclopts' converter for a name or id given to an option (``--model``, ``--name``):
    never empty or blank, as no name or id of llmgw is. ``--model "$MODEL"`` with the
    variable unset would otherwise list the replicas of a model that cannot exist: none,
    with exit 0."""
    if not tokens[0].value.strip():
        raise ArgumentRefused("cannot be empty")
    return tokens[0].value


def filled_path(_type: object, tokens: Sequence[Token]) -> Path:
    """cyclopts' converter for a file or directory given as an argument or option: never
    empty or blank. ``Path("")`` is the current directory: ``--dir "$CA_DIR"`` with the
    variable unset would otherwise create a CA wherever the command ran."""
    if not tokens[0].value.strip():
        raise ArgumentRefused("cannot be empty")
    return Path(tokens[0].value)


def segment(value: str, what: str) -> str:
    """``value`` as one path segment, quoted (ids are the operator's input); a
    ``UsageError`` naming ``what`` (``the model name``) when it cannot be one. Empty, it
    would leave ``//`` in the path, which names another resource once collapsed; with a
    ``/``, it would be two segments once the server decodes it; ``.`` or ``..``, the URL
    would be read as the path it leads to (``history replica ..`` asked for
    ``/admin/v1/history``). No name or id of llmgw is any of them."""
    if not value.strip():
        raise UsageError(f"{what} cannot be empty")
    if "/" in value:
        raise UsageError(f"{what} cannot hold a '/': {value!r}")
    if value in (".", ".."):
        raise UsageError(f"{what} cannot be {value!r}: a URL reads it as a step up its path")
    return quote(value, safe="")
