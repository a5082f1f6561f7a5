"""cyclopts' converters for the ``llmgw-agent`` flags whose plain reading would take a
mistake for a value: an empty path, a GPU index or a size in MiB not in decimal digits.
Each refuses with a ``FlagRefused``, which the usage error line follows the flag with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from cyclopts import Token

_GPU_INDEX = re.compile(r"-?[0-9]{1,9}")


class FlagRefused(ValueError):
    """A flag's value refused by its converter. The usage error line names the flag and
    follows it with this message: ``llmgw-agent: --state-dir cannot be empty``."""


def filled_path(_type: object, tokens: Sequence[Token]) -> Path:
    """cyclopts' converter for a file or directory flag: never empty or blank. ``Path("")``
    is the current directory: ``--state-dir "$DIR"`` with the variable unset would otherwise
    keep the agent's records, and engine logs, wherever it was started."""
    if not tokens[0].value.strip():
        raise FlagRefused("cannot be empty")
    return Path(tokens[0].value)


def filled_paths(_type: object, tokens: Sequence[Token]) -> list[Path]:
    """``filled_path`` for a flag given several times."""
    for token in tokens:
        if not token.value.strip():
            raise FlagRefused("cannot be empty")
    return [Path(token.value) for token in tokens]


def gpu_index(_type: object, tokens: Sequence[Token]) -> int:
    """cyclopts' converter for a GPU index (``fake-gpu --gpu``): decimal digits, nothing
    else. cyclopts' own reading of an ``int`` rounds ``1.5`` to 2 and takes ``0x10`` for 16
    and ``1_0`` for 10: a mark on another GPU than the one meant. A negative one is left to
    the command, which says why it refuses it."""
    text = tokens[0].value.strip()
    if not _GPU_INDEX.fullmatch(text):
        raise FlagRefused(f"{tokens[0].value!r}: expected a GPU index, a whole number such as 3")
    return int(text)


def mebibytes(_type: object, tokens: Sequence[Token]) -> int:
    """cyclopts' converter for a size in MiB (``fake-gpu use --mib``): decimal digits,
    nothing else, for the reasons of ``gpu_index``. A negative one is left to the command."""
    text = tokens[0].value.strip()
    if not _GPU_INDEX.fullmatch(text):
        raise FlagRefused(f"{tokens[0].value!r}: expected MiB, a whole number such as 30000")
    return int(text)
