"""A canary step's verdict: the gateways' figures of the new revision's replicas (the
canary) against the model's other replicas (the stable side), and which replicas of
each the gateways keep out of rotation for failing.

The verdict is one of:

- **roll back** when the gateways ejected a replica of the new revision for failing
  requests in a row during the hold (as the log keeps them: ``Rollout.hold_ejections``)
  and none of the others: the canary is routed around, so its figures say little
  of it (a replica out of rotation gets one request a cool-off), and it fails where the old
  revision does not;
- **roll back** when the canary is worse: its error rate more than
  ``max_error_rate_increase`` above the stable side's, or a latency p95 more than
  ``max_latency_ratio`` times the stable side's, each judged only on enough samples; and
  when the canary saw fewer than ``min_requests`` requests but so many of them failed that
  no success among the requests it lacks could bring it within the allowance; and, when the
  stable side saw too few requests to compare with, when more than half of the canary's
  (of ``min_requests`` at least) failed and not as many of the stable side's;
- **inconclusive** when a gateway's report left out, past the replicas a report lists,
  replicas that may be the canary's or the stable side's (``TrafficFigures.unlisted``):
  their figures would be partial, and a verdict on them could promote or roll back on
  requests it cannot see;
- **inconclusive** while too few were seen to tell: fewer than ``min_requests`` requests on
  either side, a latency p95 of fewer than ``min_latency_samples`` samples on either side
  (a p95 of fewer than 20 samples is their slowest: one slow request would fail a canary,
  one fast one pass it), or both sides ejected;
- **promote** otherwise.

A request whose client left before any of the answer came counts, on either side, as a
request that failed (``as_judged``): a hung canary's clients give up on it.

``waiting_for`` says what a verdict taken now would still wait for, for the status while
the step holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

import msgspec

from app.domain.model_spec import RolloutPolicy
from app.domain.traffic import TrafficFigures

PROMOTE = "promote"
ROLL_BACK = "roll_back"
INCONCLUSIVE = "inconclusive"


class Ejected(msgspec.Struct, frozen=True, kw_only=True):
    """The replicas of each side that live gateways kept out of rotation for failing during
    the hold: replica id -> the most gateways seen ejecting it at once."""

    canary: dict[str, int] = {}
    stable: dict[str, int] = {}


NONE_EJECTED = Ejected()


def judge(
    canary: TrafficFigures | None,
    stable: TrafficFigures | None,
    policy: RolloutPolicy,
    ejected: Ejected = NONE_EJECTED,
) -> tuple[str, str]:
    """``(verdict, why)`` for a canary's figures against the stable replicas' (each as
    ``as_judged``)."""
    canary, stable = as_judged(canary), as_judged(stable)
    if ejected.canary:
        return _judged_by_ejections(ejected)
    partial = _partial(canary, stable)
    if partial is not None:
        return INCONCLUSIVE, partial
    needed = policy.min_requests
    seen_canary = canary.requests if canary else 0
    seen_stable = stable.requests if stable else 0
    if canary is not None and stable is not None and seen_canary < needed <= seen_stable:
        failed_already = _failed_past_allowance(canary, stable, policy)
        if failed_already is not None:
            return ROLL_BACK, failed_already
    if canary is not None and seen_stable < needed:
        failing_anyway = _failing_whatever_the_baseline(canary, stable, policy)
        if failing_anyway is not None:
            return ROLL_BACK, failing_anyway
    if canary is None or stable is None or seen_canary < needed or seen_stable < needed:
        return INCONCLUSIVE, _too_few_requests(seen_canary, seen_stable, needed)
    worse: list[str] = []
    canary_rate = canary.error_rate or 0.0
    stable_rate = stable.error_rate or 0.0
    if _error_rate_increase(canary, stable) > _as_written(policy.max_error_rate_increase):
        worse.append(
            f"error rate {canary_rate:.1%} against {stable_rate:.1%} "
            f"(at most {policy.max_error_rate_increase * 100:g} point(s) more allowed)"
        )
    said = [f"error rate {canary_rate:.1%} against {stable_rate:.1%}"]
    for name, new, old in _latencies(canary, stable, policy):
        said.append(f"{name} {new:.1f} ms against {old:.1f} ms")
        if new > old * policy.max_latency_ratio:
            worse.append(
                f"{name} {new:.1f} ms against {old:.1f} ms "
                f"(at most {policy.max_latency_ratio:g}x allowed)"
            )
    if worse:
        return ROLL_BACK, "; ".join(worse)
    short = _latency_samples_short(canary, stable, policy)
    if short is not None:
        return INCONCLUSIVE, short
    return PROMOTE, "; ".join(said)


def as_judged(figures: TrafficFigures | None) -> TrafficFigures | None:
    """``figures`` as the verdict judges them: requests whose clients left before any of the
    answer came (``abandoned``) counted as requests that failed. A replica that hangs has
    no answer to fail: its clients give up, and it would look quiet, pausing the rollout,
    rather than failing. Both sides are counted so, so clients as impatient with both
    revisions leave the comparison as it was."""
    if figures is None or figures.abandoned == 0:
        return figures
    requests = figures.requests + figures.abandoned
    errors = figures.errors + figures.abandoned
    return msgspec.structs.replace(
        figures, requests=requests, errors=errors, error_rate=errors / requests, abandoned=0
    )


def waiting_for(
    canary: TrafficFigures | None,
    stable: TrafficFigures | None,
    policy: RolloutPolicy,
    ejected: Ejected = NONE_EJECTED,
) -> str | None:
    """What a verdict reached on these figures now would still wait for (too few requests
    or latency samples, with the counts); None when it would decide."""
    verdict, why = judge(canary, stable, policy, ejected)
    return why if verdict == INCONCLUSIVE else None


def _judged_by_ejections(ejected: Ejected) -> tuple[str, str]:
    canary = _named(ejected.canary)
    if ejected.stable:
        return INCONCLUSIVE, (
            f"the gateways ejected replicas of both revisions for failing (the new revision's "
            f"{canary}; the others' {_named(ejected.stable)}): the new revision is not the "
            "only one failing"
        )
    return ROLL_BACK, (
        f"the gateways ejected the new revision's {canary} during the hold for failing "
        "requests in a row, and none of the others"
    )


def _named(ejected: Mapping[str, int]) -> str:
    """``replica r1 (by 2 gateways)``, the first few of several by id."""
    shown = [f"{rid} (by {count} gateway(s))" for rid, count in sorted(ejected.items())[:3]]
    more = len(ejected) - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more else "")
    return f"replica(s) {listed}"


def _partial(canary: TrafficFigures | None, stable: TrafficFigures | None) -> str | None:
    """Why the figures are partial, if a gateway's report may have left out replicas of
    either side."""
    sides = [
        f"{figures.unlisted} gateway(s) may have left replicas of {name} out of their reports"
        for name, figures in (("the new revision", canary), ("the others", stable))
        if figures is not None and figures.unlisted
    ]
    if not sides:
        return None
    return (
        f"{' and '.join(sides)} (past the replicas a report lists): the figures may lack "
        "their requests"
    )


def _too_few_requests(seen_canary: int, seen_stable: int, needed: int) -> str:
    return (
        f"the gateways saw {seen_canary} request(s) to the new revision and "
        f"{seen_stable} to the others, fewer than min_requests {needed}"
    )


_LATENCIES = (
    ("TTFT p95", "ttft_p95_ms", "ttft_samples"),
    ("TPOT p95", "tpot_p95_ms", "tpot_samples"),
    ("latency p95", "latency_p95_ms", "latency_samples"),
)


def _latencies(
    canary: TrafficFigures, stable: TrafficFigures, policy: RolloutPolicy
) -> list[tuple[str, float, float]]:
    """``(name, canary's p95, stable side's p95)`` of each latency figure measured on at
    least ``min_latency_samples`` samples on both sides."""
    enough = policy.min_latency_samples
    judged: list[tuple[str, float, float]] = []
    for name, figure, samples in _LATENCIES:
        new: float | None = getattr(canary, figure)
        old: float | None = getattr(stable, figure)
        if new is None or old is None:
            continue
        if getattr(canary, samples) >= enough and getattr(stable, samples) >= enough:
            judged.append((name, new, old))
    return judged


def _latency_samples_short(
    canary: TrafficFigures, stable: TrafficFigures, policy: RolloutPolicy
) -> str | None:
    """Why the latency cannot be judged yet: a figure measured (on either side) on fewer
    than ``min_latency_samples`` samples on a side. A figure neither side measured (no
    streamed answer, say) has nothing to wait for."""
    enough = policy.min_latency_samples
    short: list[str] = []
    for name, _, samples in _LATENCIES:
        new, old = getattr(canary, samples), getattr(stable, samples)
        if (new or old) and (new < enough or old < enough):
            short.append(f"{name} from {new} sample(s) of the new revision and {old} of the others")
    if not short:
        return None
    return f"{'; '.join(short)}, fewer than min_latency_samples {enough}"


def _failed_past_allowance(
    canary: TrafficFigures, stable: TrafficFigures, policy: RolloutPolicy
) -> str | None:
    """Why a canary short of ``min_requests`` is rolled back all the same: its errors alone
    put it above the allowed error rate even if every request it lacks succeeded. A canary
    failing each request is ejected by the gateways and sent one request a cool-off, so it
    never reaches ``min_requests`` in a window; paused for an operator to promote, it
    would be offered as a step too quiet to judge. None while a verdict could still go
    either way."""
    needed = policy.min_requests
    stable_rate = Fraction(stable.errors, stable.requests)
    allowed = stable_rate + _as_written(policy.max_error_rate_increase)
    if Fraction(canary.errors, needed) <= allowed:
        return None
    return (
        f"{canary.errors} of {canary.requests} request(s) to the new revision failed: above "
        f"the allowed error rate ({float(stable_rate):.1%} and "
        f"{policy.max_error_rate_increase * 100:g} point(s) more) even if its next "
        f"{needed - canary.requests} succeeded"
    )


FAILING_ANYWAY = Fraction(1, 2)
"""A canary error rate no baseline excuses: over it, on ``min_requests`` requests, the
canary is rolled back even when the old revision saw too few requests to compare with."""


def _failing_whatever_the_baseline(
    canary: TrafficFigures, stable: TrafficFigures | None, policy: RolloutPolicy
) -> str | None:
    """Why a canary is rolled back without a baseline (the stable side saw fewer than
    ``min_requests``): more than half of its requests failed, counting any it lacks of
    ``min_requests`` as successes. An old revision that gets almost no traffic would
    otherwise pause a canary failing everything (one the gateways do not eject, with
    ``--eject-after-failures 0``) for an operator to promote. None when the stable side's
    own requests failed as much: then the new revision is not the only one failing."""
    needed = policy.min_requests
    if Fraction(canary.errors, max(canary.requests, needed)) <= FAILING_ANYWAY:
        return None
    if (
        stable is not None
        and stable.requests
        and (Fraction(stable.errors, stable.requests) > FAILING_ANYWAY)
    ):
        return None
    seen_stable = stable.requests if stable else 0
    return (
        f"{canary.errors} of {canary.requests} request(s) to the new revision failed, more "
        f"than {float(FAILING_ANYWAY):.0%} of min_requests {needed} or more: rolled back "
        f"whatever the others' error rate ({seen_stable} request(s) to them, too few to "
        "compare with)"
    )


def _error_rate_increase(canary: TrafficFigures, stable: TrafficFigures) -> Fraction:
    """How much higher the canary's error rate is than the stable side's, exactly: in
    binary floating point 7/100 - 6/100 is more than 0.01, and a canary exactly at the
    allowed increase would be rolled back. Both sides have requests (``min_requests``)."""
    return Fraction(canary.errors, canary.requests) - Fraction(stable.errors, stable.requests)


def _as_written(share: float) -> Fraction:
    """A share as the spec wrote it (0.01 is one hundredth), not as its nearest float."""
    return Fraction(repr(share))
