"""Autoscaling: a model's replica count follows its demand. A pure decision, no I/O.

Demand is what the gateways report: the requests they have in flight on the model's
replicas plus those they hold queued for it (a request held for a model starting from
zero is among them), summed over every gateway whose report is fresh. An engine's own
queue is inside that figure: a request the engine holds waiting is in flight for the
gateway that sent it. The reconciler samples it every pass (``observe``) and keeps the
samples of the longest window a policy needs; a control plane that starts has none, so
it scales up at once when demand says so but down only once it has watched a whole window.

``decide`` compares the demand with what one replica should carry (``AutoscalePolicy``):
- **up** as soon as the demand averaged over ``up_window_s`` needs more replicas than the
  model has (a burst shorter than that window moves the average only by its share);
- **down** only when the *highest* of those ``up_window_s`` averages over the last
  ``down_window_s`` needs fewer: a signal that swings across a threshold keeps the count
  where its peaks need it, so it does not flap, and one sample's spike (a handful of
  requests arriving together) does not hold replicas that the average never needed. With
  ``down_window_min_share`` below 1 a deeper drop waits less: to ``c`` of ``n`` replicas
  after ``max(down_window_min_share, c / n)`` of the window, the highest average over that
  span needing at most ``c`` (a fall to half the demand is as clear after half the window
  as a fall by one replica after the whole of it);
- by at most ``max_step`` replicas a decision, never outside ``[min, max]``;
- **to zero** (``min`` 0) only after ``idle_to_zero_s`` without any request: no demand
  sampled, and no gateway's traffic window heard of a request made in that span
  (``DemandSample.heard_within_s``, ``_idle``); back to one as soon as a request is held
  for it;
- **not at all** while no gateway reports: a pass that hears from none takes no sample
  and forgets those it had (``observe`` with ``None``), so the count holds, and once heard
  again waits a whole window before it comes down, as after a failover. Silence is not
  zero demand: a gateway that cannot reach the database, or a stalled one, still serves
  its clients, and reading its silence as an idle fleet (or as the demand first heard
  after it) would scale a busy model down to its minimum;
- **not down** while some gateway is silent (it reported within
  ``app.domain.reports.SILENT_HOLD_S`` but not recently, and did not stop cleanly): the
  samples then leave its requests out (``partial``), so they can prove more demand but
  never less, and a drop or an idle span waits until it holds no partial sample.

Every average above is over time: a sample stands for the time since the one before it.
Passes do not come evenly (a scale event wakes three or four within a fifth of a second,
each taking the gateways' latest reports again), and a mean per sample would count such a
cluster several times over. A sample stands for no more than it can, though: after a gap
in the leader's own passes longer than ``GAP_PASSES`` pass intervals (its database out of
reach for a minute, a stall), the first sample stands for one interval and the rest of
the gap is unknown: neither demand nor idleness. The means are over the time known, and a
drop or an idle span waits until its span holds no more unknown time than a window's
first sample may be late (``COVERED_SLACK_S``), as after a start.

Each change is a ``ModelScaled`` with the figures that decided it; the replicas it removes
go as a scale-down always goes: out of routing, then stopped once the gateways report them
idle (``app.domain.reconcile``).

``decide`` is total over what a log may hold: a log written before the spec's bounds on
``target`` and ``capacity`` (and the admin API's on a bench summary's ``capacity``) may carry
a per-replica load of next to nothing, or one that is not a number at all, and dividing the
demand by it would give no count. The decision then holds the count it has and says why, so
one such model never stops a reconcile pass for the others; a count outside ``[min, max]``
still comes into them, as while no demand is heard.
"""

from __future__ import annotations

import bisect
import itertools
import math
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import msgspec

from app.domain.events import ScaleInputs
from app.domain.model_spec import MIN_AUTOSCALE_TARGET, AutoscalePolicy
from app.domain.state import ClusterState, Model

HEARD_WITHIN_S = 1.0
"""The latest sample may be this old for ``decide`` to act: a pass samples just before it
decides, so an older one means the passes since heard from no gateway."""
COVERED_SLACK_S = 2.0
"""A window counts as watched when its first sample is at most this late (a pass or two),
or a tenth of the window when that is less, so that a window of seconds is watched whole;
so much unknown time (gaps in the passes, below) it may hold in all."""
GAP_PASSES = 3
"""A sample taken more than this many pass intervals after the one before it follows a gap
in the passes: it stands for one interval, not for the whole gap."""
WHOLE_TOLERANCE = 1e-9
"""How near a whole number of replicas a load's ratio to a replica's counts as that number
(relative, above 1): far more than a sum's rounding, far less than any request."""
MIN_PER_REPLICA = MIN_AUTOSCALE_TARGET
"""The least load per replica ``decide`` scales by: the least the spec accepts (a ``target``,
or a ``capacity`` share of a bench capacity, at least 0.01 of at least 1)."""


class DemandSample(msgspec.Struct, frozen=True, array_like=True):
    at: datetime
    demand: float
    partial: bool = False
    """Some gateway was silent: ``demand`` is a floor, the silent gateway's requests left
    out."""
    stands_for_s: float | None = None
    """How far back the sample stands for: None, since the sample before it; after a gap in
    the passes, one pass interval, the time before that back to the sample before it being
    unknown."""
    heard_within_s: float | None = None
    """A live gateway's traffic window held a request to one of the model's replicas (one
    answered, failed or cancelled): it ended at most this long before the sample, the
    longest window the gateways report. None when no window held one, or none was read (a
    model whose minimum is above 0). Demand is what is in flight at the sample, which a
    short request now and then almost never is: this is how such a model is not idle."""


class ScaleDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The count a model should have, why, and the figures that decided it. ``replicas`` is
    the count the model has when the figures were unusable and the count holds: nothing is
    recorded for it."""

    replicas: int
    reason: str
    inputs: ScaleInputs | None
    """None for a count brought into its bounds with no demand to go by: none is heard, or
    the per-replica load is unusable (an infinite one would not survive the log's JSON)."""


def longest_window_s(policy: AutoscalePolicy) -> float:
    """How far back ``decide`` looks for ``policy``."""
    return max(policy.up_window_s, policy.down_window_s, policy.idle_to_zero_s)


def observe(
    history: Mapping[str, tuple[DemandSample, ...]],
    demand: Mapping[str, float] | None,
    models: Mapping[str, Model],
    now: datetime,
    *,
    pass_interval_s: float,
    partial: bool = False,
    heard: Mapping[str, float] | None = None,
) -> dict[str, tuple[DemandSample, ...]]:
    """The samples after this pass: each autoscaled model's demand now (0 when the
    gateways report none for it), older samples kept for its longest window. ``None``:
    no gateway reported, so the demand is unknown and every sample is forgotten: the next
    one heard would otherwise stand for the whole silence, and the count would come down
    on a single report after it, where it must watch a whole window again. ``partial``:
    some gateway is silent, so the demand is at least this. ``pass_interval_s``: how far
    apart passes come when nothing wakes them; a sample more than ``GAP_PASSES`` of them
    after the one before it stands for one of them, the rest of the gap unknown. A ``now``
    before the latest sample (the clock stepped back) forgets the samples, as a leader
    that starts has none. ``heard``: the models some gateway's window holds a request of,
    with that window's length (``app.domain.autoscale_heard``)."""
    kept: dict[str, tuple[DemandSample, ...]] = {}
    gap = timedelta(seconds=GAP_PASSES * pass_interval_s)
    for name, model in models.items():
        policy = model.spec.autoscale
        if policy is None or model.removed:
            continue
        if demand is None:
            kept[name] = ()
            continue
        since = now - timedelta(seconds=longest_window_s(policy) + COVERED_SLACK_S)
        earlier = history.get(name, ())
        if earlier and earlier[-1].at > now:
            # The clock stepped back: the samples say nothing of the time before now, and
            # the means take them in order of time. Start again, as a leader that starts.
            earlier = ()
        earlier = earlier[bisect.bisect_left(earlier, since, key=_taken_at) :]
        after_gap = bool(earlier) and now - earlier[-1].at > gap
        sample = DemandSample(
            now,
            float(demand.get(name, 0.0)),
            partial=partial,
            stands_for_s=pass_interval_s if after_gap else None,
            heard_within_s=None if heard is None else heard.get(name),
        )
        kept[name] = (*earlier, sample)
    return kept


def _taken_at(sample: DemandSample) -> datetime:
    return sample.at


def demand_by_model(
    state: ClusterState, in_flight: Mapping[str, int], queued: Mapping[str, int]
) -> dict[str, float]:
    """Requests in flight on each model's replicas plus those held queued for it."""
    demand: dict[str, float] = {name: float(count) for name, count in queued.items()}
    for replica_id, count in in_flight.items():
        replica = state.replicas.get(replica_id)
        if replica is not None:
            demand[replica.model] = demand.get(replica.model, 0.0) + count
    return demand


def per_replica_load(model: Model, policy: AutoscalePolicy) -> tuple[float, str]:
    """What one replica should carry, and where that figure comes from."""
    benched = _benched_capacity(model)
    if policy.capacity is not None and benched is not None:
        return benched * policy.capacity, (
            f"{policy.capacity:g} of the capacity bench measured ({benched:g} concurrent)"
        )
    if policy.capacity is not None:
        return policy.target, f"target {policy.target:g} (no bench result to take a share of)"
    return policy.target, f"target {policy.target:g}"


def _benched_capacity(model: Model) -> float | None:
    summary = model.tuned_summary or {}
    capacity = summary.get("capacity")
    if isinstance(capacity, int | float) and not isinstance(capacity, bool) and capacity > 0:
        # An integer too large for a float (an older log may hold one) reads as infinity,
        # on which ``decide`` holds, rather than raising here.
        return math.inf if capacity > sys.float_info.max else float(capacity)
    return None


def decide(model: Model, samples: Sequence[DemandSample], now: datetime) -> ScaleDecision | None:
    """The count ``model`` should have now, or None to keep the one it has; the count it has,
    with the reason, when its figures give no count to scale to."""
    policy = model.spec.autoscale
    if policy is None or model.removed:
        return None
    current = model.spec.replicas
    if not samples or now - samples[-1].at > timedelta(seconds=HEARD_WITHIN_S):
        # No gateway has reported since: the demand is unknown, not zero, and the count
        # holds; but never outside the bounds, which need no demand to hold (``max`` is
        # the model's cap on the fleet, however long the gateways are silent).
        return _into_bounds(current, policy)
    per_replica, source = per_replica_load(model, policy)
    latest = samples[-1].demand
    timeline = _Timeline(_looked_back_on(samples, now, policy))
    mean_up = timeline.mean(now, policy.up_window_s)
    down_from = now - timedelta(seconds=policy.down_window_s)
    highest = _HighestAverages(timeline, policy.up_window_s, down_from)
    max_down = highest.since(down_from)
    inputs = ScaleInputs(
        demand=latest,
        per_replica=per_replica,
        per_replica_from=source,
        up_window_mean=mean_up,
        down_window_max=max_down,
        samples=len(samples),
    )
    unusable = _unusable(per_replica, source)
    if unusable:
        # No count to scale to, but the bounds need none (as while no demand is heard).
        return _into_bounds(current, policy, why=unusable) or ScaleDecision(
            replicas=current, reason=f"the count holds: {unusable}", inputs=inputs
        )
    wanted_up = replicas_for(mean_up, per_replica)
    drop = _drop(samples, timeline, highest, now, policy, current, per_replica)
    desired, reason = current, ""
    if current == 0 and latest > 0:
        desired = max(1, min(wanted_up, policy.max_step))
        reason = f"demand {latest:g} for a model with no replica"
    elif wanted_up > current:
        desired = min(wanted_up, current + policy.max_step)
        reason = (
            f"demand averaged {mean_up:.1f} over {policy.up_window_s:g}s needs {wanted_up} "
            f"replica(s) at {per_replica:g} each"
        )
    elif drop is not None:
        desired, waited_s, peak = drop
        inputs = msgspec.structs.replace(inputs, down_wait_s=waited_s, down_wait_max=peak)
        reason = (
            f"demand averaged at most {peak:.1f} over {round(waited_s, 1):g}s needs "
            f"{replicas_for(peak, per_replica)} replica(s) at {per_replica:g} each"
        )
        if waited_s < policy.down_window_s:
            share = waited_s / policy.down_window_s
            reason += (
                f" ({share:.0%} of the {policy.down_window_s:g}s window: {current} to {desired})"
            )
        if desired == 0 and not _idle(samples, now, policy.idle_to_zero_s):
            desired = 1
            reason += f"; one stays until {policy.idle_to_zero_s:g}s without any request"
        elif desired == 0:
            reason = f"no demand for {policy.idle_to_zero_s:g}s"
    bounded = min(max(desired, policy.min_replicas), policy.max_replicas)
    if bounded != desired:
        limit = "min" if bounded > desired else "max"
        reason = f"{reason + '; ' if reason else ''}held to {limit} {bounded}"
        desired = bounded
    if desired == current:
        return None
    return ScaleDecision(replicas=desired, reason=reason, inputs=inputs)


def _into_bounds(
    current: int, policy: AutoscalePolicy, *, why: str = "no demand heard"
) -> ScaleDecision | None:
    """The count brought into ``[min, max]`` with no demand to go by (``why``); None when it
    is."""
    bounded = min(max(current, policy.min_replicas), policy.max_replicas)
    if bounded == current:
        return None
    limit = "min" if bounded > current else "max"
    return ScaleDecision(replicas=bounded, reason=f"held to {limit} {bounded} ({why})", inputs=None)


def replicas_for(load: float, per_replica: float) -> int:
    """The replicas ``load`` needs at ``per_replica`` each: ``ceil(load / per_replica)``, but
    a ratio within ``WHOLE_TOLERANCE`` of a whole number is that number. A mean is a sum over
    time in floating point: a steady 12 may average 12.000000000000227, and 12 at 4 each
    needs 3 replicas, not 4 (which the down window's peak would then hold)."""
    ratio = load / per_replica
    if math.isfinite(ratio):
        whole = round(ratio)
        if abs(ratio - whole) <= WHOLE_TOLERANCE * max(1.0, abs(ratio)):
            return int(whole)
    return math.ceil(ratio)


def _unusable(per_replica: float, source: str) -> str:
    """Why a replica's load gives no count to scale to ("" when it does): the demand divided
    by less than ``MIN_PER_REPLICA`` may be more replicas than a float holds."""
    if math.isfinite(per_replica) and per_replica >= MIN_PER_REPLICA:
        return ""
    return (
        f"{per_replica:g} per replica ({source}) is not a load to scale by "
        f"(at least {MIN_PER_REPLICA:g})"
    )


def _looked_back_on(
    samples: Sequence[DemandSample], now: datetime, policy: AutoscalePolicy
) -> Sequence[DemandSample]:
    """The samples the means may use: from the last one at or before the earliest start of
    an up window that ends within the down window. A leader keeps samples for the whole
    idle spell (up to a day), which only ``_idle`` reads; a timeline of all of them would
    make every pass as slow as the longest idle spell is long."""
    earliest = now - timedelta(seconds=policy.down_window_s + policy.up_window_s)
    first = bisect.bisect_right(samples, earliest, key=lambda s: s.at) - 1
    return samples[max(first, 0) :]


def _drop(
    samples: Sequence[DemandSample],
    timeline: _Timeline,
    highest: _HighestAverages,
    now: datetime,
    policy: AutoscalePolicy,
    current: int,
    per_replica: float,
) -> tuple[int, float, float] | None:
    """The fewest replicas (at most ``max_step`` fewer) that the demand has needed no more
    than for as long as a drop to them waits, with that wait and the highest up-window mean
    over it; None when no drop has waited long enough. A deeper drop waits less (with
    ``down_window_min_share`` below 1) but needs the lower demand, so it may be ready while
    a smaller one, whose longer wait still holds higher demand, is not."""
    found = None
    # Every wait is at most the down window: one walk finds the partial sample they may hold.
    partial_at = _latest_partial(samples, now - timedelta(seconds=policy.down_window_s))
    for count in range(current - 1, max(current - policy.max_step, 0) - 1, -1):
        wait_s = policy.down_window_s * max(policy.down_window_min_share, count / current)
        if not timeline.watched(now, wait_s):
            continue
        if partial_at is not None and partial_at >= now - timedelta(seconds=wait_s):
            continue
        peak = highest.since(now - timedelta(seconds=wait_s))
        if replicas_for(peak, per_replica) <= count:
            found = (count, wait_s, peak)
    return found


class _Timeline:
    """The samples as demand over time: each sample's figure held since the sample before
    it (the first one's has no span; one after a gap in the passes, ``stands_for_s`` of
    it, the rest unknown), and the means over windows of what is known."""

    def __init__(self, samples: Sequence[DemandSample]) -> None:
        self.moments = [s.at for s in samples]
        self._origin = samples[0].at
        self._times = [(at - self._origin).total_seconds() for at in self.moments]
        self._values = [s.demand for s in samples]
        # _starts[i]: where what the i-th sample stands for begins; between the sample
        # before it and there, nothing is known (the gaps).
        self._starts = [0.0, *self._times[:-1]]
        self.gaps: list[tuple[float, float]] = []
        after_gaps = [
            (i, s.stands_for_s) for i, s in enumerate(samples) if s.stands_for_s is not None
        ]
        for i, stands_for_s in after_gaps:
            start = max(self._starts[i], self._times[i] - stands_for_s)
            if i and start > self._starts[i]:
                self.gaps.append((self._starts[i], start))
                self._starts[i] = start
        # _covered[i], _known[i]: the integral of the demand, and the time known, from the
        # first sample to the i-th (summed in order, one list each: a pass builds a timeline
        # of hundreds of samples for every autoscaled model).
        spans = [t - start for t, start in zip(self._times[1:], self._starts[1:], strict=True)]
        areas = [v * span for v, span in zip(self._values[1:], spans, strict=True)]
        self._covered = list(itertools.accumulate(areas, initial=0.0))
        self._known = list(itertools.accumulate(spans, initial=0.0))

    def mean(self, end: datetime, window_s: float) -> float:
        """The demand averaged over the ``window_s`` before ``end``, over as much of it as
        the samples up to ``end`` are known to cover (the latest sample's figure when they
        cover none)."""
        at = (end - self._origin).total_seconds()
        last = max(bisect.bisect_right(self._times, at) - 1, 0)
        return self._mean_to(last, at - window_s)

    def _mean_to(self, last: int, start: float) -> float:
        """The mean from ``start`` to the ``last``-th sample, over the time known."""
        first = bisect.bisect_right(self._times, start, hi=last)  # the first after ``start``
        if first == 0:  # the first sample is inside: what it stands for is not known
            area, known = self._covered[last], self._known[last]
        else:  # the one before is not, so the first inside stands for the window's start on
            own = max(self._times[first] - max(self._starts[first], start), 0.0)
            area = self._values[first] * own + self._covered[last] - self._covered[first]
            known = own + self._known[last] - self._known[first]
        return area / known if known > 0 else self._values[last]

    def means_ending_at_each(self, window_s: float, first: int = 0) -> list[float]:
        """The mean over ``window_s`` ending at each sample from the ``first``-th on: each as
        ``_mean_to`` gives it, the first sample inside each window found by one walk
        forward (the windows' starts only move forward) rather than a search per window."""
        times, values, starts = self._times, self._values, self._starts
        covered, known_to = self._covered, self._known
        means: list[float] = []
        inside = bisect.bisect_right(times, times[first] - window_s, hi=first)
        for last in range(first, len(times)):
            start = times[last] - window_s
            while inside < last and times[inside] <= start:
                inside += 1
            if inside == 0:
                area, known = covered[last], known_to[last]
            else:
                begin = starts[inside] if starts[inside] >= start else start
                own = times[inside] - begin
                own = own if own >= 0.0 else 0.0
                area = values[inside] * own + covered[last] - covered[inside]
                known = own + known_to[last] - known_to[inside]
            means.append(area / known if known > 0 else values[last])
        return means

    def watched(self, now: datetime, window_s: float) -> bool:
        """Whether the samples cover the window ending ``now``: its first sample at most a
        tenth of it late (at most ``COVERED_SLACK_S``; a control plane just started has not
        watched it), and no more than that unknown in all, gaps in the passes included."""
        late_s = min(COVERED_SLACK_S, window_s / 10)
        start = now - timedelta(seconds=window_s)
        if self.moments[0] > start + timedelta(seconds=late_s):
            return False
        if not self.gaps:
            return True
        since = (start - self._origin).total_seconds()
        before_first = max(self._times[0] - since, 0.0)
        unknown = sum(max(end - max(begin, since), 0.0) for begin, end in self.gaps)
        return before_first + unknown <= late_s


class _HighestAverages:
    """The mean over ``window_s`` ending at each sample from ``earliest`` on, and the
    highest of those ending at or after any moment from ``earliest`` on. Only those are
    asked for (a drop waits at most the down window), and a leader keeps samples for the
    idle-to-zero time, three times as long by default: the means before ``earliest`` would
    be two thirds of the work of a pass."""

    def __init__(self, timeline: _Timeline, window_s: float, earliest: datetime) -> None:
        self._times = timeline.moments
        self._earliest = earliest
        # At least the latest sample's mean, for a moment that no sample ends at or after.
        self._first = min(bisect.bisect_left(self._times, earliest), len(self._times) - 1)
        means = timeline.means_ending_at_each(window_s, self._first)
        self._highest_from = list(itertools.accumulate(reversed(means), max))[::-1]

    def since(self, moment: datetime) -> float:
        """The highest mean ending at or after ``moment`` (the latest one when none does);
        ``moment`` is not before ``earliest``."""
        assert moment >= self._earliest, (moment, self._earliest)
        first = min(bisect.bisect_left(self._times, moment), len(self._times) - 1)
        return self._highest_from[first - self._first]


def _latest_partial(samples: Sequence[DemandSample], since: datetime) -> datetime | None:
    """When the latest sample from ``since`` on that left a silent gateway's requests out was
    taken; None when none did."""
    for sample in reversed(samples):
        if sample.at < since:
            return None
        if sample.partial:
            return sample.at
    return None


def _idle(samples: Sequence[DemandSample], now: datetime, window_s: float) -> bool:
    """Whether no sample of the last ``window_s`` (the latest, when none is that recent)
    holds demand or leaves a silent gateway's out, none heard of a request made within it,
    and the samples watched the whole of it (as ``_Timeline.watched``). One walk back from
    the latest sample, which stops at the first request: no timeline of a spell that may
    hold a day of samples.

    A sample heard of a request that ended at most ``heard_within_s`` before it: only one
    taken that long after the spell's start is sure the request came within the spell, so
    with a spell at least as long as the gateways' window the samples of its last
    ``window_s - heard_within_s`` tell (to a window's slot) whether any came. The latest
    sample's word counts whatever the spell: a spell shorter than the window then ends at
    most a window after the last request, rather than before it."""
    late_s = min(COVERED_SLACK_S, window_s / 10)
    start = now - timedelta(seconds=window_s)
    if samples[0].at > start + timedelta(seconds=late_s):
        return False
    unknown_s = max((samples[0].at - start).total_seconds(), 0.0)
    for i in range(len(samples) - 1, -1, -1):
        sample = samples[i]
        if sample.at < start and i < len(samples) - 1:
            break
        if sample.demand != 0 or sample.partial:
            return False
        if sample.heard_within_s is not None and (
            i == len(samples) - 1 or sample.at - timedelta(seconds=sample.heard_within_s) >= start
        ):
            return False
        if i and sample.stands_for_s is not None:
            before = samples[i - 1].at
            gap_end = max(before, sample.at - timedelta(seconds=sample.stands_for_s))
            unknown_s += max((gap_end - max(before, start)).total_seconds(), 0.0)
    return unknown_s <= late_s
