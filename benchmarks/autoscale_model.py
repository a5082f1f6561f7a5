"""A model of ``benchmarks/autoscale.py``'s autoscaled run in seconds instead of minutes:
the same trace and arrivals, the real decision (``app.domain.autoscale``), and a queueing
model of the cluster instead of processes, to see where a decision rule or a policy lies
on the trade-off between the SLO and replica-seconds before measuring it.

    python benchmarks/autoscale_model.py [--up-window 2] [--down-window 10]
        [--down-window-min-share 0.5] [--target 1.5] [--noise-seeds 3] [--interval-mean]
        [--oracle-ahead S --oracle-slack X] [--arrivals-window S --arrivals-slack X]
        [--max-in-flight N]

The model, in steps of 10 ms: a replica serves ``MAX_NUM_SEQS`` requests at once in
decode steps of ``DECODE_MS`` (a request joins at the next step and has its first token
one step later, its last ``MAX_TOKENS`` steps later); the gateway sends each request to
the serving replica with the fewest in flight (or holds it while none serves); it reports
in flight plus held every 0.5 s, and the leader samples the latest report every 0.2 s
(``benchmarks/autoscale.py``'s cluster: ``--reconcile-interval 0.2``) and applies the
decision at once. A replica placed serves ``START_S`` later (give or take, drawn), one
removed leaves routing at once and stops ``STOP_S`` after the quiesce time, once idle;
its replica-seconds run from placement to stop, as the benchmark counts them. What it
leaves out: the machine (CPU contention, the engines' and the gateway's jitter).

``--oracle-ahead``/``--oracle-slack`` replace the autoscaler by a count that knows the
trace's rate: at each pass the most replicas the rate needs (times the slack) from now to
that many seconds ahead, never below one: what an autoscaler that could see the demand
coming would do, a bound for a reactive one.

``--arrivals-window``/``--arrivals-slack`` replace the demand the decision reads (requests in
flight and held) by the rate of arrivals the gateway counted over that many seconds up to
its last report, times the slack, in replicas: up at once when it needs more, down as the
policy's down window and share say. Arrivals respond to a burst before requests in flight
do (those lag by an answer's length); a shorter window is noisier, Poisson arrivals being
what they are.

``--max-in-flight`` is the model's ``routing.max_in_flight``: the gateway sends a replica a
request only while it has fewer than that many in flight, and holds the rest until one
has room (a replica that starts serving takes them), as ``app.gateway.admission`` does.
"""

from __future__ import annotations

import argparse
import bisect
import random
import sys
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain import autoscale
from app.domain.autoscale import DemandSample, ScaleDecision
from app.domain.envelope import Meta, Recorded
from app.domain.events import ModelDeclared, ScaleInputs
from app.domain.evolve import replay
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from app.domain.state import Model
from benchmarks.autoscale import (
    DECODE_MS,
    MAX_NUM_SEQS,
    MAX_TOKENS,
    SERVICE_S,
    Trace,
    replicas_for,
)

TICK_S = 0.01
STEP_S = DECODE_MS / 1000
START_S = 0.7
"""Placement to serving, give or take: the simulator's start and the agent's news of it
(the agent's logs in the benchmark's runs of 2026-12-03: 0.65-0.69 s on average from the
command to ``ready``, with readiness asked ten times a second), and the gateway's."""
STOP_S = 0.3
QUIESCE_S = 0.8
"""A replica out of routing stops once the gateway has reported a table without it (its
next report after the next pass: half a second and a pass, on average) and is idle; the
fixed quiesce time (2 s) only when a gateway does not say."""
REPORT_S = 0.5
PASS_S = 0.2
OVERHEAD_S = 0.02
"""The client's and the gateway's share of a TTFT."""
ORIGIN = datetime(2026, 12, 2, tzinfo=UTC)

Decide = Callable[[Model, Sequence[DemandSample], datetime], ScaleDecision | None]


@dataclass
class Replica:
    number: int
    placed_s: float
    serving_s: float
    step_offset_s: float
    running: list[float] = field(default_factory=list)
    """When each running request ends."""
    waiting: deque[float] = field(default_factory=deque)
    """When each waiting request was due."""
    stopping_s: float | None = None
    ended_s: float | None = None

    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting)

    def stop_when_done(self, now_s: float) -> None:
        """A replica out of routing stops once the quiesce time is over and it is idle, at
        once when it never served."""
        if self.stopping_s is None or self.ended_s is not None:
            return
        quiesced = now_s - self.stopping_s >= QUIESCE_S and self.in_flight() == 0
        if quiesced or now_s < self.serving_s:
            self.ended_s = now_s + STOP_S


class Outcome(msgspec.Struct, frozen=True):
    within_slo_pct: float
    outside: int
    replica_seconds: float
    scale_events: int


def simulate(
    policy: AutoscalePolicy,
    decide: Decide,
    trace: Trace,
    due: Sequence[float],
    noise_seed: int,
    *,
    interval_mean: bool = False,
    max_in_flight: int | None = None,
) -> Outcome:
    """One run; with ``interval_mean`` each report is the in-flight-plus-held count averaged
    over the half second since the last one, instead of that count at the moment of the
    report."""
    rng = random.Random(noise_seed)
    spec = ModelSpec(name="trace", command="sim --port {port}", replicas=1, autoscale=policy)
    declared = Recorded(
        position=1,
        stream="model-trace",
        version=1,
        event_id=uuid.uuid4(),
        recorded_at=ORIGIN,
        meta=Meta(actor="benchmark"),
        event=ModelDeclared(model="trace", spec=spec),
    )
    model = replay([declared]).models["trace"]
    replicas = [Replica(0, -10.0, -10.0, rng.uniform(0, STEP_S))]
    held: deque[float] = deque()
    ttfts: list[float] = []
    history: dict[str, tuple[DemandSample, ...]] = {}
    reported, reported_at, events, arrived = 0.0, -1.0, 0, 0
    accumulated = 0.0
    for tick in range(int((trace.duration_s + 30) / TICK_S)):
        now_s = tick * TICK_S
        routable = [
            r
            for r in replicas
            if r.stopping_s is None and r.ended_s is None and now_s >= r.serving_s
        ]
        while arrived < len(due) and due[arrived] < now_s + TICK_S:
            held.append(due[arrived])
            arrived += 1
        while held and routable:
            chosen = min(routable, key=lambda r: (r.in_flight(), -r.number))
            if max_in_flight is not None and chosen.in_flight() >= max_in_flight:
                break
            chosen.waiting.append(held.popleft())
        for replica in replicas:
            if replica.ended_s is not None or now_s < replica.serving_s:
                continue
            if (now_s - replica.step_offset_s) % STEP_S < TICK_S:
                replica.running = [end for end in replica.running if end > now_s + 1e-9]
                while replica.waiting and len(replica.running) < MAX_NUM_SEQS:
                    ttfts.append(now_s + STEP_S + OVERHEAD_S - replica.waiting.popleft())
                    replica.running.append(now_s + MAX_TOKENS * STEP_S)
        for replica in replicas:
            replica.stop_when_done(now_s)
        demand = sum(r.in_flight() for r in replicas if r.ended_s is None) + len(held)
        accumulated += demand * TICK_S
        if now_s - reported_at >= REPORT_S - 1e-9:
            span_s = now_s - max(reported_at, 0.0)
            averaged = interval_mean and span_s > 0
            reported = accumulated / span_s if averaged else float(demand)
            accumulated, reported_at = 0.0, now_s
        if tick % round(PASS_S / TICK_S) or now_s >= trace.duration_s:
            continue
        at = ORIGIN + timedelta(seconds=now_s)
        history = autoscale.observe(
            history, {"trace": reported}, {"trace": model}, at, pass_interval_s=PASS_S
        )
        decision = decide(model, history["trace"], at)
        if decision is None:
            continue
        events += 1
        counted = [r for r in replicas if r.stopping_s is None and r.ended_s is None]
        for _ in range(decision.replicas - len(counted)):
            start = now_s + START_S + rng.uniform(-0.2, 0.3)
            replicas.append(Replica(len(replicas), now_s, start, rng.uniform(0, STEP_S)))
        newest_first = sorted(counted, key=lambda r: (now_s >= r.serving_s, -r.number))
        for replica in newest_first[: max(0, len(counted) - decision.replicas)]:
            replica.stopping_s = now_s
        model = msgspec.structs.replace(
            model, spec=msgspec.structs.replace(model.spec, replicas=decision.replicas)
        )
    held_s = sum(
        max(0.0, min(trace.duration_s, r.ended_s or trace.duration_s) - max(0.0, r.placed_s))
        for r in replicas
    )
    within = sum(1 for ttft in ttfts if ttft <= SLO_S)
    return Outcome(
        within_slo_pct=round(100 * within / len(due), 2),
        outside=len(due) - within,
        replica_seconds=round(held_s, 1),
        scale_events=events,
    )


SLO_S = 0.5


def oracle(trace: Trace, target: float, ahead_s: float, slack: float, most: int) -> Decide:
    """The count the trace's rate needs from now to ``ahead_s`` ahead, times ``slack``."""

    def decide(
        model: Model, _samples: Sequence[DemandSample], now: datetime
    ) -> ScaleDecision | None:
        now_s = (now - ORIGIN).total_seconds()
        steps = range(round(ahead_s / 0.1) + 1)
        needed = max(replicas_for(trace.rate(now_s + i * 0.1) * slack, target) for i in steps)
        needed = min(needed, most)
        if needed == model.spec.replicas:
            return None
        inputs = ScaleInputs(demand=0.0, per_replica=target, per_replica_from="the trace")
        return ScaleDecision(replicas=needed, reason="the trace's rate", inputs=inputs)

    return decide


def arrivals_rate(
    due: Sequence[float], policy: AutoscalePolicy, window_s: float, slack: float
) -> Decide:
    """A count from the arrivals the gateway counted in the ``window_s`` before its last
    report: up at once; down to ``c`` of ``n`` only when, for ``max(share, c / n)`` of the
    down window, no pass needed more than ``c``."""
    needed: list[tuple[float, int]] = []

    def decide(
        model: Model, _samples: Sequence[DemandSample], now: datetime
    ) -> ScaleDecision | None:
        now_s = (now - ORIGIN).total_seconds()
        reported_s = int(now_s / REPORT_S) * REPORT_S
        counted = bisect.bisect_left(due, reported_s) - bisect.bisect_left(
            due, reported_s - window_s
        )
        rate = counted / window_s * slack
        wanted = min(policy.max_replicas, replicas_for(rate, policy.target))
        needed.append((now_s, wanted))
        current = model.spec.replicas
        inputs = ScaleInputs(demand=rate, per_replica=policy.target, per_replica_from="arrivals")
        if wanted > current:
            return ScaleDecision(replicas=wanted, reason="arrivals", inputs=inputs)
        for count in range(max(policy.min_replicas, 1), current):
            span_s = policy.down_window_s * max(policy.down_window_min_share, count / current)
            if now_s >= span_s and max(n for at, n in needed if at >= now_s - span_s) <= count:
                return ScaleDecision(replicas=count, reason="arrivals", inputs=inputs)
        return None

    return decide


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7, help="the trace's, as the benchmark's")
    parser.add_argument("--target", type=float, default=1.5)
    parser.add_argument("--up-window", type=float, default=2.0)
    parser.add_argument("--down-window", type=float, default=10.0)
    parser.add_argument("--down-window-min-share", type=float, default=0.5)
    parser.add_argument("--noise-seeds", type=int, default=3, help="runs of the model's noise")
    parser.add_argument(
        "--interval-mean",
        action="store_true",
        help="reports averaged over their half second instead of sampled at its end",
    )
    parser.add_argument("--oracle-ahead", type=float, help="seconds the oracle sees ahead")
    parser.add_argument("--oracle-slack", type=float, default=1.0)
    parser.add_argument(
        "--arrivals-window",
        type=float,
        help="seconds of arrivals the count is read from, instead of the demand",
    )
    parser.add_argument("--arrivals-slack", type=float, default=1.0)
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=MAX_NUM_SEQS,
        help="routing.max_in_flight: hold the rest in the gateway (0: no bound)",
    )
    arguments = parser.parse_args(argv)
    trace = Trace.seeded(random.Random(arguments.seed), 300.0, 1.0, 16.0, 3)
    due = trace.arrivals(random.Random(arguments.seed + 1))
    peak = replicas_for(trace.highest(), arguments.target)
    policy = AutoscalePolicy(
        min_replicas=1,
        max_replicas=peak,
        target=arguments.target,
        up_window_s=arguments.up_window,
        down_window_s=arguments.down_window,
        down_window_min_share=arguments.down_window_min_share,
        max_step=4,
        cold_start_timeout_s=60.0,
    )

    def fresh() -> Decide:
        """The decision for one run: the arrivals' keeps what each pass needed."""
        if arguments.oracle_ahead is not None:
            return oracle(
                trace, arguments.target, arguments.oracle_ahead, arguments.oracle_slack, peak
            )
        if arguments.arrivals_window is not None:
            return arrivals_rate(due, policy, arguments.arrivals_window, arguments.arrivals_slack)
        return autoscale.decide

    outcomes = [
        simulate(
            policy,
            fresh(),
            trace,
            due,
            seed,
            interval_mean=arguments.interval_mean,
            max_in_flight=arguments.max_in_flight or None,
        )
        for seed in range(arguments.noise_seeds)
    ]
    fixed = peak * trace.duration_s
    for outcome in outcomes:
        print(
            f"within the SLO {outcome.within_slo_pct:.2f} % ({outcome.outside} out), "
            f"{outcome.replica_seconds:.0f} replica-s "
            f"({100 * outcome.replica_seconds / fixed:.1f} % of a fixed {peak}), "
            f"{outcome.scale_events} scale events"
        )
    mean_slo = sum(o.within_slo_pct for o in outcomes) / len(outcomes)
    mean_share = sum(100 * o.replica_seconds / fixed for o in outcomes) / len(outcomes)
    print(f"mean: {mean_slo:.2f} % within the SLO at {mean_share:.1f} % (service {SERVICE_S:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
