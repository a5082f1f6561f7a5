"""`llmgw-cli autoscale MODEL [--min N] [--max N] ...` and `autoscale MODEL --off`: a model's
replica count follows its demand, or goes back to what operators set (docs/autoscaling.md).

It sends only the fields it is given (``PATCH .../autoscale``): the admin API merges them
with the policy the model has when the change is recorded, so that two operators changing
different fields at once both keep theirs, and a change refused as a conflict with another
recorded at that instant can be sent once more as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Annotated

from cyclopts import Parameter

from cli.arguments import (
    MAX_REPLICAS,
    NumberWithin,
    UsageError,
    WholeNumberWithin,
    segment,
)
from cli.client import ADMIN, AdminClient, ApiProblem
from cli.config import ConnectionFlags
from cli.operator import Output, Reply, call, run_command
from cli.render import EXIT_OK, counted, print_json, say, utc_seconds
from cli.views import AutoscaleDecisionView, AutoscaleView, ModelChange

ModelName = Annotated[str, Parameter(help="The model to autoscale, such as llama-3-8b.")]
Seconds = float | None

MAX_WINDOW_S = 86_400
"""The longest window or idle spell the admin API accepts, a day; as ``MAX_REPLICAS``, written
again (a test holds it equal to the domain's) and checked before anything is sent."""
MAX_COLD_START_S = 3_600
"""The longest a gateway may hold a request for a cold start, an hour, likewise."""

OPTIONS = (
    ("min", "--min"),
    ("max", "--max"),
    ("target", "--target"),
    ("capacity", "--capacity"),
    ("up_window_s", "--up-window"),
    ("down_window_s", "--down-window"),
    ("down_window_min_share", "--down-window-min-share"),
    ("idle_to_zero_s", "--idle-to-zero"),
    ("max_step", "--max-step"),
    ("cold_start_timeout_s", "--cold-start-timeout"),
)
"""Each policy field, as the API names it, and its option, in the order of the options."""


def autoscale(
    name: ModelName,
    /,
    *,
    min_replicas: Annotated[
        int | None,
        Parameter(
            name="--min",
            converter=WholeNumberWithin(0, MAX_REPLICAS),
            help=f"The fewest replicas, 0 to {MAX_REPLICAS}. 0 lets an idle model scale to zero.",
        ),
    ] = None,
    max_replicas: Annotated[
        int | None,
        Parameter(
            name="--max",
            converter=WholeNumberWithin(1, MAX_REPLICAS),
            help=f"The most replicas, 1 to {MAX_REPLICAS}, at least --min.",
        ),
    ] = None,
    target: Annotated[
        float | None,
        Parameter(
            converter=NumberWithin(0.01, 100_000),
            help="Requests one replica should carry: in flight on it plus queued for the "
            "model, as the gateways report them (0.01 to 100000). Given alone, it replaces "
            "a --capacity in force; give both to keep that, with this for while the model "
            "has no bench result.",
        ),
    ] = None,
    capacity: Annotated[
        float | None,
        Parameter(
            converter=NumberWithin(0.01, 1),
            help="Instead of --target, the share (0.01 to 1) of the concurrency `llmgw-cli "
            "bench` measured a replica serving within its SLO: 0.8 keeps each replica at "
            "80 % of it. Without a bench result, --target is used.",
        ),
    ] = None,
    up_window: Annotated[
        Seconds,
        Parameter(
            converter=NumberWithin(0, MAX_WINDOW_S),
            help="Seconds of demand averaged to scale up (0 to 86400, a day): up as soon as "
            "that average needs more replicas; a burst shorter than this moves it only by its "
            "share.",
        ),
    ] = None,
    down_window: Annotated[
        Seconds,
        Parameter(
            converter=NumberWithin(0, MAX_WINDOW_S),
            help="Seconds the demand must stay low to scale down (0 to 86400): down only "
            "when the highest demand over them needs fewer replicas, so a noisy signal does "
            "not flap.",
        ),
    ] = None,
    down_window_min_share: Annotated[
        float | None,
        Parameter(
            converter=NumberWithin(0, 1, above_low=True),
            help="The least share of --down-window a scale-down waits: a drop from n "
            "replicas to c waits max(this, c/n) of it, so halving the count waits half the "
            "window. 1 (the default): every drop waits the whole window.",
        ),
    ] = None,
    idle_to_zero: Annotated[
        Seconds,
        Parameter(
            converter=NumberWithin(0, MAX_WINDOW_S),
            help="With --min 0, seconds without any request before the last replica goes "
            "(0 to 86400); a scale-down too, it also waits --down-window (times "
            "--down-window-min-share): the longer of the two. Requests are heard through "
            "the gateways' traffic windows (60 s): below a window, the last replica goes "
            "once no window holds a request, at most a window after the last one.",
        ),
    ] = None,
    max_step: Annotated[
        int | None,
        Parameter(
            help=f"The most replicas one decision adds or removes, 1 to {MAX_REPLICAS}.",
            converter=WholeNumberWithin(1, MAX_REPLICAS),
        ),
    ] = None,
    cold_start_timeout: Annotated[
        Seconds,
        Parameter(
            converter=NumberWithin(0, MAX_COLD_START_S, above_low=True),
            help="With --min 0, seconds a gateway holds a request for a model scaled to "
            "zero while a replica starts; then 503 with Retry-After (at most 3600).",
        ),
    ] = None,
    off: Annotated[
        bool,
        Parameter(
            help="Stop autoscaling: the count stays where it is, for `llmgw-cli scale`.",
            negative=(),
        ),
    ] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Let a model's replica count follow its demand, between --min and --max; or stop
    with --off. Options not given keep the model's current values (the defaults when it is
    not autoscaled yet: min 1, max 1, target 4, up window 10s, down window 300s, idle to
    zero 900s, max step 4, cold start timeout 300s).

    Demand is the requests the gateways have in flight on the model's replicas plus those
    they hold queued for it. The model needs demand / load-per-replica replicas, where the
    load one replica should carry is --target requests, or, with --capacity and a bench
    result, that share of what bench measured. It scales up as soon as the demand averaged
    over --up-window needs more, and down only once the highest demand over --down-window
    needs fewer, at most --max-step at a time; replicas removed leave routing first and stop
    once idle. Every change is a model_scaled by the autoscaler with what it saw
    (`llmgw-cli model NAME` shows the last one).

    A change that meets another of the model recorded at the same instant (409 conflict)
    is sent once more, merged again with the policy as it is then; a second is reported.

    ```
    llmgw-cli autoscale llama-3-8b --min 1 --max 8 --target 6
    llmgw-cli autoscale llama-3-8b --capacity 0.8 --down-window 600
    llmgw-cli autoscale llama-3-8b --min 0 --idle-to-zero 1800
    llmgw-cli autoscale llama-3-8b --off
    ```
    """
    values = (
        min_replicas,
        max_replicas,
        target,
        capacity,
        up_window,
        down_window,
        down_window_min_share,
        idle_to_zero,
        max_step,
        cold_start_timeout,
    )
    given = {
        field: value for (field, _), value in zip(OPTIONS, values, strict=True) if value is not None
    }

    def change(client: AdminClient) -> int:
        path = f"{ADMIN}/models/{segment(name, 'the model name')}/autoscale"
        if off and given:
            options = ", ".join(option for field, option in OPTIONS if field in given)
            raise UsageError(f"--off takes no other option (given: {options})")
        if not off and not given:
            raise UsageError(
                "say what to change (--min, --max, --target, --capacity, ...), or --off; "
                f"`llmgw-cli model {name}` shows the policy"
            )
        if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
            raise UsageError(
                f"--min must be at most --max, got --min {min_replicas} and --max {max_replicas}"
            )
        if off:
            reply = resent_once_on_conflict(lambda: call(client, ModelChange, "DELETE", path))
        else:
            # Null sends the capacity in force back to none, else the new target would not apply.
            dropped = {"capacity": None} if "target" in given and "capacity" not in given else {}
            reply = resent_once_on_conflict(
                lambda: call(client, ModelChange, "PATCH", path, body=dropped | given)
            )
        if output == "json":
            print_json(reply.raw)
        else:
            say(_said(reply.value, off))
        return EXIT_OK

    return run_command("autoscale", connection, change)


def resent_once_on_conflict(send: Callable[[], Reply[ModelChange]]) -> Reply[ModelChange]:
    """``send()``, and once more if the API answers 409 ``conflict``: another change to the
    model was recorded at the same instant and this one recorded nothing. Sending it again
    is safe, as the API merges the options again with the policy the model has then; a
    second conflict is reported as any refusal is."""
    try:
        return send()
    except ApiProblem as exc:
        if exc.status != HTTPStatus.CONFLICT or exc.title != "conflict":
            raise
    return send()


def _said(change: ModelChange, off: bool) -> str:
    model = change.model
    policy = model.spec.autoscale
    if off:
        if not change.changed:
            return f"model {model.name}: not autoscaled, nothing recorded"
        return (
            f"model {model.name}: autoscaling off; it stays at "
            f"{counted(model.desired, 'replica')} (llmgw-cli scale {model.name} N changes it)"
        )
    if not change.changed or policy is None:
        return f"model {model.name}: autoscaling unchanged, nothing recorded"
    return (
        f"model {model.name}: autoscaled, {policy_text(policy)}; "
        f"now {model.desired} desired, {model.serving} serving"
    )


def bounds_text(policy: AutoscaleView) -> str:
    """``auto 1..8``."""
    return f"auto {policy.min_replicas}..{policy.max_replicas}"


def policy_text(policy: AutoscaleView) -> str:
    """The policy in one line: bounds, the load per replica, windows, step, zero."""
    load = f"{policy.target:g} requests per replica"
    if policy.capacity is not None:
        load = (
            f"{policy.capacity:.0%} of the benched capacity per replica "
            f"({policy.target:g} requests without a bench result)"
        )
    text = (
        f"{policy.min_replicas}..{policy.max_replicas} replicas, {load}, up on the "
        f"{policy.up_window_s:g}s average, down after {policy.down_window_s:g}s below, "
        f"at most {policy.max_step} a step"
    )
    if policy.down_window_min_share < 1:
        text += f" (a deeper drop after {policy.down_window_min_share:.0%} of it at least)"
    if policy.min_replicas == 0:
        text += (
            f", to zero after {policy.idle_to_zero_s:g}s idle (a cold start holds requests "
            f"up to {policy.cold_start_timeout_s:g}s)"
        )
    return text


def decision_text(decision: AutoscaleDecisionView) -> str:
    """``2026-12-01 09:00:00 UTC, 2 -> 4: <reason>``."""
    at = f"{utc_seconds(decision.recorded_at)} UTC, " if decision.recorded_at else ""
    return f"{at}{decision.previous} -> {decision.replicas}: {decision.reason}"


def inputs_text(decision: AutoscaleDecisionView) -> str | None:
    """What the autoscaler saw when it decided, or None when the event says nothing."""
    seen = decision.inputs
    if seen is None:
        return None
    parts = [
        f"demand {seen.demand:g}",
        f"{seen.per_replica:g} per replica ({seen.per_replica_from})",
    ]
    if seen.up_window_mean is not None:
        parts.append(f"up-window mean {seen.up_window_mean:.1f}")
    if seen.down_window_max is not None:
        parts.append(f"down-window peak {seen.down_window_max:.1f}")
    if seen.down_wait_s is not None and seen.down_wait_max is not None:
        parts.append(f"peak {seen.down_wait_max:.1f} over the {seen.down_wait_s:g}s waited")
    parts.append(counted(seen.samples, "sample"))
    return ", ".join(parts)
