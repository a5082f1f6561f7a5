"""What a program's usage error prints, read whole in a test.

Every program writes its usage errors as one line on a console of its own that never wraps
(``app/usage_errors.py``). A test that hands a program another error console hands it this
one: as wide as no message of ours, so that what it looks for is never cut into lines,
whichever console the program would otherwise use and whatever terminal width (or
``COLUMNS``) an earlier test in the same worker left.
"""

from __future__ import annotations

from rich.console import Console

WIDE_COLUMNS = 200


def wide_error_console() -> Console:
    """stderr (so ``capsys`` reads it), wide enough that no message of ours is cut."""
    return Console(stderr=True, width=WIDE_COLUMNS)
