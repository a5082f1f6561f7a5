"""What the kernel refuses to start, measured on an engine's command line before a model is
declared: the agent starts each engine with ``posix_spawnp``, which fails the same way at
every start of a replica that breaks one of these, while the replica holds its GPUs."""

from __future__ import annotations

from collections.abc import Sequence

MAX_ARGUMENT_BYTES = 128 * 1024 - 1
"""The longest one argument may be, in bytes: Linux refuses a longer one with E2BIG
(``MAX_ARG_STRLEN``, 32 pages with its terminating NUL; 4 KiB pages, the smallest)."""


def argv_refusal(argv: Sequence[str]) -> str | None:
    """Why no engine could be started with ``argv`` (placeholders filled in at their
    longest), or None."""
    if not argv or not argv[0]:
        return "names an empty program: nothing could be started"
    for number, word in enumerate(argv, start=1):
        size = len(word.encode("utf-8", "surrogatepass"))
        if size > MAX_ARGUMENT_BYTES:
            return (
                f"makes word {number} up to {size} bytes long (placeholders filled in), "
                f"over the {MAX_ARGUMENT_BYTES} bytes Linux allows one argument: every "
                "start would fail with 'Argument list too long'"
            )
    return None
