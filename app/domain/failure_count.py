"""How a model's failures in a row (``Model.failures``) are told, in the same words
wherever they are read: ``llmgw-cli model`` (``model_status``) and the gateway's 503 to a
request for a model failing to start. The count is of more than failed starts (an engine
that crashed soon after it served counts too), so the words say what it counts: "failed
starts" would send a reader looking for a replica that never served."""

from __future__ import annotations

from app.domain.state import STEADY_SERVING_S


def failures_in_a_row(count: int) -> str:
    """``1 failure``, ``3 failures in a row``."""
    return "1 failure" if count == 1 else f"{count} failures in a row"


def what_failures_count(count: int) -> str:
    """What ``Model.failures`` counts, in the number of ``count``."""
    within = f"within {STEADY_SERVING_S:.0f}s of serving"
    if count == 1:
        return f"a start that failed or an engine that crashed {within}"
    return f"starts that failed or engines that crashed {within}"


def failures_told(count: int) -> str:
    """``3 failures in a row (starts that failed or engines that crashed within 60s of
    serving)``: the count and what it counts."""
    return f"{failures_in_a_row(count)} ({what_failures_count(count)})"
