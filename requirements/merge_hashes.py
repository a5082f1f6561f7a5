"""Adds to a lock the hashes another lock of the same pins knows: `make lock` resolves once
with ../shared/wheels (so a prebuilt wheel's hash is locked) and once without (so is the
source distribution's), because uv takes every hash of a package from the first place that
has it. With both, `pip install --require-hashes` accepts either file: the wheel where the
folder is, the source distribution on a machine without it.

    python requirements/merge_hashes.py LOCK OTHER    (LOCK is rewritten in place)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*==[^\s;\\]+)")
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
BLOCK_START = re.compile(r"\n(?=[A-Za-z0-9])")


def hashes_by_pin(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for block in BLOCK_START.split(text):
        pin = PIN.match(block)
        if pin is not None:
            found[pin.group(1).lower()] = HASH.findall(block)
    return found


def merged(lock: str, other: str) -> str:
    """``lock`` with each pin's hash lines holding the union of both files' hashes, sorted
    as uv writes them; pins ``other`` lacks are left as they are."""
    extra = hashes_by_pin(other)
    blocks = []
    for block in BLOCK_START.split(lock):
        pin = PIN.match(block)
        known = HASH.findall(block)
        wanted = sorted({*known, *extra.get(pin.group(1).lower(), [])}) if pin else known
        if pin is not None and wanted != known:
            head, *_ = block.split(" \\\n", 1)
            rest = [line for line in block.split("\n")[1:] if "--hash=" not in line]
            lines = [f"{head} \\", *(f"    --hash={h} \\" for h in wanted)]
            lines[-1] = lines[-1].removesuffix(" \\")
            block = "\n".join([*lines, *rest])
        blocks.append(block)
    return "\n".join(blocks)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    lock, other = map(Path, argv)
    lock.write_text(merged(lock.read_text(), other.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
