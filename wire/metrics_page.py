"""An engine's ``/metrics`` page, read as hostile input (``wire.bounded_body``): at most
``MAX_METRICS_PAGE_BYTES``, refused as soon as its declared length or what came of it says
more, never read whole.

Two programs read such pages, the gateway's scraper and ``llmgw-cli bench``; the bound
lives here because ``wire`` is the one package both may import
(``tests/unit/test_layers.py``). Each caller closes its connection on ``BodyTooLarge`` and
says it in its own words; the time a page may take is each caller's own timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterable

from wire.bounded_body import read_bounded

MAX_METRICS_PAGE_BYTES = 16 << 20
"""The most of a ``/metrics`` page read. vLLM's, with its histograms for a few models and
LoRA adapters, is a few hundred KiB."""


async def read_metrics_page(declared: int | None, parts: AsyncIterable[bytes]) -> bytes:
    """The page whose ``content-length`` is ``declared`` (``None``: not given) and whose body
    comes as ``parts``; ``BodyTooLarge`` past the bound, with nothing more read."""
    return await read_bounded(declared, parts, MAX_METRICS_PAGE_BYTES)
