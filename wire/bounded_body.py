"""An answer's body read as hostile input: at most a bound, refused as soon as its declared
length or what came of it says more, never read whole.

Both the gateway (an engine's ``/metrics``, ``wire.metrics_page``) and ``llmgw-cli bench``
(``/metrics`` and ``GET /v1/models``) read engines' answers this way; it lives here because
``wire`` is the one package both may import (``tests/unit/test_layers.py``). Each caller
closes its connection on ``BodyTooLarge`` and says it in its own words; the time a body
may take is each caller's own timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterable


class BodyTooLarge(Exception):
    """The body declares, or goes on to, more than the bound (the text says which, as
    ``declares N bytes, over 16 MiB`` or ``goes on past 16 MiB``)."""


async def read_bounded(declared: int | None, parts: AsyncIterable[bytes], bound: int) -> bytes:
    """The body whose ``content-length`` is ``declared`` (``None``: not given) and which
    comes as ``parts``; ``BodyTooLarge`` past ``bound`` bytes, with nothing more read."""
    if declared is not None and declared > bound:
        raise BodyTooLarge(f"declares {declared} bytes, over {size_words(bound)}")
    read: list[bytes] = []
    size = 0
    async for part in parts:
        size += len(part)
        if size > bound:
            raise BodyTooLarge(f"goes on past {size_words(bound)}")
        read.append(part)
    return b"".join(read)


def size_words(count: int) -> str:
    """``16 MiB``, ``1.5 MiB``, or ``1,000 bytes`` for a bound below a MiB."""
    return f"{count / 2**20:g} MiB" if count >= 2**20 else f"{count:,} bytes"
