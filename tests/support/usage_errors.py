"""What a program's usage error prints, read whole in a test.

cyclopts draws a usage error in a panel as wide as its error console, and an ``App`` keeps
the first error console it makes: as wide as the terminal (or ``COLUMNS``) was then, which
in a test worker is whatever an earlier test left. A long message would then be cut into
lines inside the panel, and a test looking for it would fail or pass with the order the
tests ran in. A test hands the program this console instead.
"""

from __future__ import annotations

from rich.console import Console

WIDE_COLUMNS = 200


def wide_error_console() -> Console:
    """stderr (so ``capsys`` reads it), wide enough that no message of ours is cut."""
    return Console(stderr=True, width=WIDE_COLUMNS)
