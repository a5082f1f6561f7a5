"""Heap settling for a long-lived server process, once it has started.

A request through the gateway allocates a few hundred container objects (dicts, lists,
coroutines, futures); with CPython's default generation-0 threshold of 700 allocations a
collection runs every couple of requests, and each one walks the young objects while
the older generations grow until a full collection walks everything the process holds:
the routing table, the app, every imported module. The profile at 50 connections charged
7.4 % of the gateway's CPU to the collector (docs/performance.md).

``settle_heap()`` does two things, once, after start-up:

- ``gc.freeze()`` moves every object alive now (modules, the app, the routing table) to
  the permanent generation, which no collection walks again;
- a generation-0 threshold of ``GEN0_THRESHOLD`` makes the young collections rarer. A
  request's objects are freed by reference counting as soon as it ends, so the young
  generation holds only what the requests in flight hold and what cycles they left: the
  collections that remain find the same garbage, less often. The older thresholds stay
  CPython's.

Measured (docs/performance.md, "Issue 18"): with it, no sample of the gateway's profile
at 50 connections is in the collector (7.4 % before); the CPU per request did not move
beyond the noise (1.00x and 1.01x of the same code without it, in the same runs), but the
p99 at 50 connections fell from 38-82 ms above direct's to 4-25 ms: what it saves is the
pauses of the full collections, not their average cost.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
"""Allocations (minus deallocations) of container objects between young collections."""


def settle_heap() -> None:
    """Freeze what the process holds now and make young collections rarer."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
