"""A model's routing policy as an operator declares it: every knob bounded with a reason
that names the bound, a bad one refused at the API's edge naming its field, a policy kept
when bench tunes the measured settings, a table row the gateway cannot read taken for the
default policy, and the decisions' reasons published in the gateway's ``/metrics``."""

from __future__ import annotations

import msgspec
import pytest
from msgspec.structs import replace

from app.admin.models import spec_from_body
from app.domain.events import ModelDeclared
from app.domain.model_spec import ModelSpec, RoutingSettings, validate_spec
from app.domain.operation_results import InvalidSpec
from app.domain.tuning import tune
from app.gateway.metrics import GatewayMetrics
from app.gateway.snapshot import route_policy
from app.gateway.table import RoutePolicy
from cli.models import routing_text
from cli.views import ModelSpecView, RoutingView
from tests.unit.test_domain_tuning import after, given

GOOD = ModelSpec(name="llama", command="vllm serve {model} --port {port}")


def routing_errors(**settings: object) -> dict[str, str]:
    spec = replace(GOOD, routing=replace(GOOD.routing, **settings))
    return {e.field: e.reason for e in validate_spec(spec)}


def test_policy_settings_within_their_bounds_are_accepted() -> None:
    assert routing_errors(policy="prefix", load_factor=0.01, prefix_bytes=16) == {}
    assert routing_errors(policy="session", load_factor=10, prefix_bytes=65_536) == {}
    assert routing_errors(session_keys=()) == {}
    assert routing_errors(max_in_flight=1) == routing_errors(max_in_flight=100_000) == {}


@pytest.mark.parametrize(
    ("settings", "field", "reason"),
    [
        ({"load_factor": 0.0}, "routing.load_factor", "between 0.01 and 10"),
        ({"load_factor": float("nan")}, "routing.load_factor", "between 0.01 and 10"),
        ({"load_factor": 1e308}, "routing.load_factor", "between 0.01 and 10"),
        ({"prefix_bytes": 15}, "routing.prefix_bytes", "between 16 and 65536"),
        ({"prefix_bytes": 10**9}, "routing.prefix_bytes", "between 16 and 65536"),
        ({"policy": "random"}, "routing.policy", "least_loaded, prefix, session"),
        ({"session_keys": ("cookie",)}, "routing.session_keys", "header, prompt_cache_key, user"),
        ({"session_keys": ("user", "user")}, "routing.session_keys", "names a source twice"),
        ({"max_in_flight": 0}, "routing.max_in_flight", "between 1 and 100000"),
        ({"max_in_flight": 100_001}, "routing.max_in_flight", "between 1 and 100000"),
    ],
)
def test_a_policy_setting_out_of_bounds_is_named_with_its_bound(
    settings: dict[str, object], field: str, reason: str
) -> None:
    errors = routing_errors(**settings)
    assert set(errors) == {field}
    assert reason in errors[field]


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        (b'{"policy": "fastest"}', "routing.policy"),
        (b'{"session_keys": ["cookie"]}', "routing.session_keys"),
        (b'{"load_factor": "lots"}', "routing.load_factor"),
        (b'{"prefix_blocks": 4}', "routing.prefix_blocks"),
        (b'{"max_in_flight": 2.5}', "routing.max_in_flight"),
    ],
)
def test_the_api_refuses_a_bad_policy_naming_its_field(routing: bytes, field: str) -> None:
    body = b'{"command": "vllm serve {model} --port {port}", "routing": ' + routing + b"}"
    with pytest.raises(InvalidSpec) as raised:
        spec_from_body(body, "llama")
    [error] = raised.value.errors
    assert error.field.startswith(field.split(".")[0])
    assert field.split(".")[-1] in f"{error.field} {error.reason}"


@pytest.mark.parametrize(
    ("routing", "field", "choices"),
    [
        (b'{"policy": "fastest"}', "routing.policy", "least_loaded, prefix, session"),
        (
            b'{"session_keys": ["user", "cookie"]}',
            "routing.session_keys[1]",
            "header, prompt_cache_key, user",
        ),
    ],
)
def test_the_api_refuses_a_name_off_the_list_naming_the_list(
    routing: bytes, field: str, choices: str
) -> None:
    body = b'{"command": "vllm serve {model} --port {port}", "routing": ' + routing + b"}"
    with pytest.raises(InvalidSpec) as raised:
        spec_from_body(body, "llama")
    [error] = raised.value.errors
    assert error.field == field
    assert error.reason.endswith(f"; must be one of {choices}")


def test_the_api_takes_a_policy_and_leaves_the_rest_at_their_defaults() -> None:
    body = b'{"command": "vllm serve {model} --port {port}", "routing": {"policy": "session"}}'
    spec = spec_from_body(body, "llama")
    assert spec.routing == RoutingSettings(policy="session")


def test_bench_tuning_a_model_keeps_its_declared_policy() -> None:
    declared = replace(
        GOOD, routing=RoutingSettings(policy="prefix", load_factor=0.5, prefix_bytes=512)
    )
    state = given(ModelDeclared(model="llama", spec=declared))
    measured = RoutingSettings(weight=2.0, target_waiting=9, kv_ceiling=0.9)
    tuned = after(state, tune(state, "llama", None, measured, {}))
    assert tuned.models["llama"].spec.routing == RoutingSettings(
        weight=2.0, target_waiting=9, kv_ceiling=0.9, policy="prefix", load_factor=0.5,
        prefix_bytes=512,
    )  # fmt: skip
    # The same measurements again change nothing, whatever the policy.
    assert tune(tuned, "llama", None, measured, {}).events == ()


def test_the_gateway_reads_a_models_policy_and_takes_an_unreadable_one_for_the_default() -> None:
    assert route_policy(b'{"policy": "prefix", "load_factor": 0.5}') == RoutePolicy(
        policy="prefix", load_factor=0.5
    )
    assert route_policy(b'{"weight": 2}') == RoutePolicy()
    assert route_policy(b'{"max_in_flight": 2}') == RoutePolicy(max_in_flight=2)
    assert route_policy(b'{"max_in_flight": 0}') is None
    assert route_policy(b'{"policy": "fastest"}') is None
    assert route_policy(b'{"load_factor": -1, "policy": "prefix"}') is None
    assert route_policy(b"[]") is None


def test_route_decisions_are_published_by_model_policy_and_reason() -> None:
    metrics = GatewayMetrics()
    metrics.watch_routes(
        lambda: {("llama", "prefix", "home"): 7, ("llama", "prefix", "over_bound"): 2}
    )
    text = metrics.render().decode()
    assert (
        'llmgw_gateway_route_decisions_total{model="llama",policy="prefix",reason="home"} 7.0'
        in text
    )
    assert 'reason="over_bound"} 2.0' in text


def test_llmgw_cli_models_show_says_the_policy() -> None:
    assert routing_text(RoutingView()) == "least_loaded"
    session = RoutingView(
        policy="session", load_factor=0.5, prefix_bytes=512, session_keys=["user"]
    )
    assert routing_text(session) == (
        "session (load factor 0.5, key 512 bytes, session key from user)"
    )
    assert routing_text(RoutingView(max_in_flight=2)) == (
        "least_loaded, at most 2 in flight per replica from each gateway"
    )
    # The admin API leaves out a policy at its defaults; the CLI reads it back as them.
    view = msgspec.json.decode(b'{"routing": {"weight": 1.0}}', type=ModelSpecView)
    assert view.routing == RoutingView()


def test_llmgw_cli_model_says_where_a_session_key_is_read_when_the_api_leaves_it_out() -> None:
    # What the admin API answers for `policy: session` with the default sources.
    view = msgspec.json.decode(b'{"routing": {"policy": "session"}}', type=ModelSpecView)
    assert routing_text(view.routing) == (
        "session (load factor 0.25, key 1024 bytes, session key from header, "
        "prompt_cache_key, user)"
    )
    defaults = RoutingSettings()
    assert (RoutingView().load_factor, RoutingView().prefix_bytes) == (
        defaults.load_factor,
        defaults.prefix_bytes,
    )
    assert tuple(RoutingView().session_keys) == defaults.session_keys
    # Declared with no sources at all, the API sends the empty list, and the CLI says so.
    none = msgspec.json.decode(
        b'{"routing": {"policy": "session", "session_keys": []}}', type=ModelSpecView
    )
    assert routing_text(none.routing).endswith("session key from nothing)")
