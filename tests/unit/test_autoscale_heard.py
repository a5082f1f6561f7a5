"""Stories of a model whose requests are short and few: sampled once a pass, its demand is
almost always 0, yet it is not idle while the gateways' windows hold its requests; it goes
to zero only once ``idle_to_zero_s`` passed without any."""

from __future__ import annotations

from datetime import datetime, timedelta

from msgspec.structs import replace

from app.domain import autoscale
from app.domain.autoscale import DemandSample, ScaleDecision
from app.domain.autoscale_heard import heard_within, replicas_to_hear
from app.domain.events import ModelDeclared
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from app.domain.state import Model, Replica, ReplicaPhase
from app.domain.traffic import TrafficFigures
from tests.unit.test_autoscale import POLICY, T0, model
from tests.unit.test_domain_operations import given

WINDOW_S = 60.0
"""The gateways' traffic window, as they report it."""


class ShortRequests:
    """Passes a second apart, none of which finds a request in flight; ``heard`` says
    whether the gateways' windows hold one (a request ended within ``WINDOW_S``)."""

    def __init__(self, llama: Model) -> None:
        self.model = llama
        self.now = T0
        self.history: dict[str, tuple[DemandSample, ...]] = {}
        self.last_request: datetime | None = None

    def seconds(self, n: int, *, request_every_s: int | None = None) -> ScaleDecision | None:
        """``n`` passes, a 50 ms request ending every ``request_every_s`` seconds between
        them (none when None); the first decision that changed the count."""
        changed = None
        for second in range(n):
            self.now += timedelta(seconds=1)
            if request_every_s is not None and second % request_every_s == 0:
                self.last_request = self.now - timedelta(seconds=0.5)
            window_start = self.now - timedelta(seconds=WINDOW_S)
            heard = self.last_request is not None and self.last_request >= window_start
            self.history = autoscale.observe(
                self.history,
                {},
                {"llama": self.model},
                self.now,
                pass_interval_s=1.0,
                heard={"llama": WINDOW_S} if heard else {},
            )
            decision = autoscale.decide(self.model, self.history["llama"], self.now)
            if decision is not None:
                spec = replace(self.model.spec, replicas=decision.replicas)
                self.model = replace(self.model, spec=spec)
                changed = changed or decision
        return changed

    @property
    def replicas(self) -> int:
        return self.model.spec.replicas

    def since_last_request_s(self) -> float:
        assert self.last_request is not None
        return (self.now - self.last_request).total_seconds()


def test_a_request_every_few_seconds_keeps_the_last_replica_however_long_it_goes_on() -> None:
    requests = ShortRequests(model(1, replace(POLICY, min_replicas=0)))

    assert requests.seconds(600, request_every_s=5) is None

    assert requests.replicas == 1
    assert all(sample.demand == 0 for sample in requests.history["llama"])


def test_one_request_a_minute_keeps_the_last_replica_too() -> None:
    requests = ShortRequests(model(1, replace(POLICY, min_replicas=0)))

    assert requests.seconds(600, request_every_s=59) is None

    assert requests.replicas == 1


def test_once_the_requests_stop_the_model_goes_to_zero_after_its_idle_spell_to_a_pass() -> None:
    requests = ShortRequests(model(1, replace(POLICY, min_replicas=0)))
    requests.seconds(300, request_every_s=5)

    # The last request is in the gateways' windows for a minute, and then the samples of
    # the idle spell's last minute hear of none: the spell counts from the request itself.
    requests.seconds(int(POLICY.idle_to_zero_s) - 5)
    assert requests.replicas == 1
    gone = requests.seconds(10)

    assert gone is not None
    assert (gone.replicas, gone.reason) == (0, "no demand for 120s")
    assert requests.since_last_request_s() >= POLICY.idle_to_zero_s


def test_an_idle_spell_shorter_than_the_window_waits_for_the_window_to_empty() -> None:
    short = replace(POLICY, min_replicas=0, down_window_s=10.0, idle_to_zero_s=15.0)
    requests = ShortRequests(model(1, short))
    requests.seconds(120, request_every_s=5)
    assert requests.replicas == 1

    # Each sample's word may be of a request older than the spell: only the latest one
    # counts, so the model waits until no window holds the request, a window at most.
    requests.seconds(int(WINDOW_S) - 5)
    assert requests.replicas == 1
    gone = requests.seconds(10)

    assert gone is not None
    assert gone.replicas == 0
    assert WINDOW_S <= requests.since_last_request_s() <= WINDOW_S + 10


def test_without_any_word_from_the_windows_the_samples_alone_decide_as_before() -> None:
    requests = ShortRequests(model(1, replace(POLICY, min_replicas=0)))

    gone = requests.seconds(200)

    assert gone is not None
    assert gone.replicas == 0


def test_only_models_that_may_go_to_zero_ask_and_their_ended_replicas_count() -> None:
    may_go = AutoscalePolicy(min_replicas=0, max_replicas=2)
    keeps_one = AutoscalePolicy(min_replicas=1, max_replicas=2)
    state = given(
        *(
            ModelDeclared(
                model=name, spec=ModelSpec(name=name, command="sim", replicas=1, autoscale=policy)
            )
            for name, policy in (("small", may_go), ("busy", keeps_one), ("fixed", None))
        )
    )
    for number, (name, phase) in enumerate(
        (
            ("small", ReplicaPhase.SERVING),
            ("small", ReplicaPhase.STOPPED),
            ("busy", ReplicaPhase.SERVING),
            ("fixed", ReplicaPhase.SERVING),
        )
    ):
        replica_id = f"{name}-{number}"
        state.replicas[replica_id] = Replica(
            id=replica_id, model=name, number=number, phase=phase, shards=(), placed_at=T0
        )

    assert replicas_to_hear(state) == {"small": ["small-0", "small-1"]}


def test_a_model_is_heard_of_by_any_request_answered_failed_or_cancelled() -> None:
    def figures(requests: int, cancelled: int) -> TrafficFigures:
        return TrafficFigures(
            window_s=WINDOW_S,
            gateways=2,
            requests=requests,
            errors=0,
            cancelled=cancelled,
            error_rate=None,
            ttft_p95_ms=None,
            ttft_samples=0,
            tpot_p95_ms=None,
            tpot_samples=0,
            latency_p95_ms=None,
            latency_samples=0,
        )

    heard = heard_within({"a": figures(1, 0), "b": figures(0, 1), "c": figures(0, 0)})

    assert heard == {"a": WINDOW_S, "b": WINDOW_S}
