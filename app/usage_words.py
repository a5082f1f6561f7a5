"""The words of a usage error, with nothing but the standard library: what the command line
held, shown as visible escapes (``shown``), the real name a mistyped one most likely
meant (``closest``), and whether a flag's value is a whole number (``whole_number``) or a
finite one (``finite_number``).
``app.usage_errors`` tells cyclopts' errors with them; the engine simulator, whose start
imports neither cyclopts nor rich, tells argparse's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
"""Decimal digits, ASCII only (``re`` reads ``[0-9]`` so), with an optional sign."""
_DECIMAL_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""``2``, ``2.5``, ``.5``, ``1e3``: decimal, ASCII digits, with an optional sign."""


def shown(text: str) -> str:
    """``text`` with every character a terminal would act on or not show (ESC, CR, a
    newline, U+202E...) written as Python writes it in a string literal (``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def closest(word: str, names: Iterable[str]) -> str | None:
    """The one name ``word`` begins, else the name it most likely misspells, else None.
    A misspelling keeps a letter of the name: every one-letter name is one edit from any
    other, and ``-x`` is no mistyped ``-h``."""
    names = list(names)
    begun = [name for name in names if name.startswith(word)]
    if len(begun) == 1:
        return begun[0]
    letters = word.lstrip("-")
    most = max(1, len(letters) // 3)
    # An edit changes the length by one at most: a name further from the word's length
    # than ``most`` is never near, and is not compared letter by letter. A word of 128 KiB
    # (a spec's engine argument reaches the simulator's command line) took over ten
    # seconds to be told unknown.
    scored = [
        (_edits(word, name), distance, name)
        for name in names
        if (distance := abs(len(name) - len(word))) <= most
    ]
    near = [
        score
        for score in scored
        if score[0] <= most and _edits(letters, score[2].lstrip("-")) < len(letters)
    ]
    return min(near, key=lambda score: score[:2])[2] if near else None


def whole_number(text: str) -> int | None:
    """``text`` as a whole number written in decimal digits, blanks around it allowed; None
    for anything else. Python's ``int`` and cyclopts' reading of an ``int`` flag are more
    lenient, each a way for a typo to become another count than the one meant: cyclopts
    rounds ``2.5`` to 2 and ``0.6`` to 1 and reads ``0x10`` as 16; both read ``1_0`` as 10
    and U+0663 (an Arabic-Indic three) as 3."""
    text = text.strip()
    if not _WHOLE_NUMBER.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4300)
        return None


def finite_number(text: str) -> float | None:
    """``text`` as a number written in decimal (``2.5``, ``1e3``), blanks around it allowed;
    None for anything else. Python's ``float``, which cyclopts reads a ``float`` flag with,
    also takes ``nan`` and ``inf`` (a timeout that never ends, a rate every comparison
    refuses), ``1e400`` (inf again), ``1_0`` for 10 and U+0663 for 3."""
    text = text.strip()
    if not _DECIMAL_NUMBER.fullmatch(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def _edits(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps
    of two neighbouring letters, one edit each."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            best = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                best = min(best, previous2[j - 2] + 1)
            row.append(best)
        previous2, previous = previous, row
    return previous[-1]
