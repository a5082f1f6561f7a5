"""An engine's ``/metrics`` page, read as hostile input: at most ``MAX_METRICS_PAGE_BYTES``,
refused as soon as its declared length or what came of it says more, never read whole.

Two programs read such pages, the gateway's scraper and ``llmgw-cli bench``; the bound and
the reading live here because ``wire`` is the one package both may import
(``tests/unit/test_layers.py``). Each caller closes its connection on ``PageTooLarge`` and
says it in its own words; the time a page may take is each caller's own timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterable

MAX_METRICS_PAGE_BYTES = 16 << 20
"""The most of a ``/metrics`` page read. vLLM's, with its histograms for a few models and
LoRA adapters, is a few hundred KiB."""

_BOUND = f"{MAX_METRICS_PAGE_BYTES >> 20} MiB"


class PageTooLarge(Exception):
    """The page declares, or goes on to, more than the bound (the text says which, as
    ``declares N bytes, over 16 MiB`` or ``goes on past 16 MiB``)."""


async def read_metrics_page(declared: int | None, parts: AsyncIterable[bytes]) -> bytes:
    """The page whose ``content-length`` is ``declared`` (``None``: not given) and whose body
    comes as ``parts``; ``PageTooLarge`` past the bound, with nothing more read."""
    if declared is not None and declared > MAX_METRICS_PAGE_BYTES:
        raise PageTooLarge(f"declares {declared} bytes, over {_BOUND}")
    read: list[bytes] = []
    size = 0
    async for part in parts:
        size += len(part)
        if size > MAX_METRICS_PAGE_BYTES:
            raise PageTooLarge(f"goes on past {_BOUND}")
        read.append(part)
    return b"".join(read)
