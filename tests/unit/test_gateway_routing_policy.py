"""The router under the ``prefix`` and ``session`` policies, without engines: no scrapers
run here, so every replica is judged by the gateway's own in-flight count (the staleness
rule, ``in_flight < 2 * target_waiting``)."""

from __future__ import annotations

import random
import tracemalloc

import msgspec

from app.gateway.affinity import RouteKey, route_key
from app.gateway.ejection import EjectionPolicy
from app.gateway.lease import Lease
from app.gateway.replica_choice import MIN_BOUND
from app.gateway.router import Router
from app.gateway.signals import EngineReading, read_engine_signals
from app.gateway.table import GatewaySnapshot, Route, RoutePolicy

MODEL = "m"
PREFIX = RoutePolicy(policy="prefix")
SESSION = RoutePolicy(policy="session")


def route(replica_id: str, **settings: object) -> Route:
    return Route(replica_id=replica_id, model=MODEL, url=f"http://{replica_id}", **settings)  # type: ignore[arg-type]


def table(*routes: Route, policy: RoutePolicy = PREFIX) -> GatewaySnapshot:
    return GatewaySnapshot(
        declared=frozenset({MODEL}), routes={MODEL: routes}, policies={MODEL: policy}
    )


FOUR = tuple(route(f"m-{n}", target_waiting=1000) for n in range(1, 5))


def chat(system: str, *turns: str) -> bytes:
    messages = [{"role": "system", "content": system}]
    for n, turn in enumerate(turns):
        if n:
            messages.append({"role": "assistant", "content": f"answer {n}"})
        messages.append({"role": "user", "content": turn})
    return msgspec.json.encode({"model": MODEL, "messages": messages})


def scraped(router: Router, replica_id: str, *, waiting: float, running: float) -> None:
    """The replica's engine was scraped just now, and said so."""
    reading = EngineReading(waiting=waiting, running=running, kv_usage=0.0, names=())
    router.replicas.reported(replica_id, 1, reading)


def key_of(body: bytes, policy: RoutePolicy = PREFIX, session: bytes | None = None) -> RouteKey:
    key = route_key(policy, body, session)
    assert key is not None
    return key


async def test_every_turn_of_a_conversation_goes_to_the_same_replica() -> None:
    router = Router()
    router.update(table(*FOUR))
    first = chat("You are terse.", "What is a ring?")
    later = chat("You are terse.", "What is a ring?", "And a hash?", "Why bounded?")
    assert key_of(first) == key_of(later)
    chosen = set()
    for body in (first, later, first):
        lease = await router.acquire(MODEL, "k", route_key=key_of(body))
        chosen.add(lease.route.replica_id)
        assert (lease.policy, lease.reason) == ("prefix", "home")
        lease.release()
    assert len(chosen) == 1


async def test_two_routers_fed_the_same_table_and_loads_choose_the_same_replicas() -> None:
    # Two gateways: separate instances, their tables read separately (equal values), and the
    # same requests arriving and ending in the same order.
    one, other = Router(), Router()
    one.update(table(*FOUR, policy=RoutePolicy(policy="prefix", load_factor=0.1)))
    other.update(table(*FOUR[::-1], policy=RoutePolicy(policy="prefix", load_factor=0.1)))
    rng = random.Random(5)
    systems = [f"system prompt {n} " * 20 for n in range(3)]
    open_one: list[Lease] = []
    open_other: list[Lease] = []
    for n in range(400):
        body = chat(rng.choice(systems), f"question {rng.randrange(40)}")
        a = await one.acquire(MODEL, "k", route_key=key_of(body))
        b = await other.acquire(MODEL, "k", route_key=key_of(body))
        assert (a.route.replica_id, a.reason) == (b.route.replica_id, b.reason), n
        open_one.append(a)
        open_other.append(b)
        if rng.random() < 0.6:
            index = rng.randrange(len(open_one))
            open_one.pop(index).release()
            open_other.pop(index).release()
    assert one.in_flight() == other.in_flight()
    # The bound did its work: some requests were passed on from their home.
    reasons = {reason for (_, _, reason) in one.route_decisions()}
    assert {"home", "over_bound"} <= reasons


async def test_a_session_stays_on_its_replica_and_moves_when_that_replica_drains() -> None:
    router = Router()
    router.update(table(*FOUR, policy=SESSION))
    body = chat("You are terse.", "hello")
    session = key_of(body, SESSION, b"conversation-42")
    assert session.kind == "session"
    # A session key outweighs the content: another first turn, same session.
    assert key_of(chat("x", "y"), SESSION, b"conversation-42") == session
    homes = set()
    for _ in range(5):
        lease = await router.acquire(MODEL, "k", route_key=session)
        homes.add(lease.route.replica_id)
        lease.release()
    (home,) = homes
    drained = tuple(
        route(r.replica_id, target_waiting=1000, draining=r.replica_id == home) for r in FOUR
    )
    router.update(table(*drained, policy=SESSION))
    moved = await router.acquire(MODEL, "k", route_key=session)
    assert moved.route.replica_id != home
    assert moved.reason == "home"  # a draining replica is on no walk while others serve
    moved.release()
    # It left routing: the session stays where it moved to.
    router.update(table(*(r for r in FOUR if r.replica_id != home), policy=SESSION))
    again = await router.acquire(MODEL, "k", route_key=session)
    assert again.route.replica_id == moved.route.replica_id


async def test_a_saturated_home_is_passed_over_and_the_request_still_served() -> None:
    router = Router()
    small = tuple(route(f"m-{n}", target_waiting=1) for n in range(1, 4))  # 2 each in flight
    router.update(table(*small))
    key = key_of(chat("s", "q"))
    first = await router.acquire(MODEL, "k", route_key=key)
    second = await router.acquire(MODEL, "k", route_key=key)
    home = first.route.replica_id
    # Under the bound's floor (MIN_BOUND) the home keeps its key...
    assert (second.route.replica_id, second.reason) == (home, "home")
    # ...until admission refuses it: saturated, it is passed over.
    third = await router.acquire(MODEL, "k", route_key=key)
    assert third.route.replica_id != home
    assert third.reason == "unavailable"


async def test_a_home_above_its_bound_passes_its_key_on() -> None:
    router = Router()
    router.update(table(*FOUR))
    key = key_of(chat("s", "q"))
    held = [await router.acquire(MODEL, "k", route_key=key) for _ in range(MIN_BOUND)]
    home = held[0].route.replica_id
    assert {lease.route.replica_id for lease in held} == {home}
    # 4 carried, 5 with this one: over max(ceil(1.25 * 5 / 4), MIN_BOUND) = 4.
    spilled = await router.acquire(MODEL, "k", route_key=key)
    assert (spilled.reason, spilled.route.replica_id != home) == ("over_bound", True)
    held[0].release()
    back = await router.acquire(MODEL, "k", route_key=key)
    assert (back.route.replica_id, back.reason) == (home, "home")


async def test_a_request_without_a_key_and_the_least_loaded_policy_go_by_load() -> None:
    router = Router()
    router.update(table(*FOUR))
    lease = await router.acquire(MODEL, "k", route_key=None)
    assert (lease.policy, lease.reason) == ("prefix", "no_key")
    plain = Router()
    plain.update(table(*FOUR, policy=RoutePolicy(policy="least_loaded")))
    lease = await plain.acquire(MODEL, "k", route_key=key_of(chat("s", "q")))
    assert (lease.policy, lease.reason) == ("least_loaded", "least_loaded")
    assert plain.route_decisions() == {(MODEL, "least_loaded", "least_loaded"): 1}


async def test_a_model_without_a_declared_policy_routes_by_load() -> None:
    # The default (docs/gateway-routing.md says why): a table without the model's policy.
    router = Router()
    router.update(GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: FOUR}))
    assert route_key(RoutePolicy(), chat("s", "q"), b"conversation-1") is None
    lease = await router.acquire(MODEL, "k")
    assert (lease.policy, lease.reason) == ("least_loaded", "least_loaded")


async def test_the_rendezvous_is_kept_while_the_replicas_and_weights_stay_the_same() -> None:
    router = Router()
    router.update(table(*FOUR))
    rendezvous = router.rendezvous_of(MODEL)
    router.update(table(*FOUR))
    assert router.rendezvous_of(MODEL) is rendezvous
    router.update(table(*FOUR[:3]))
    assert router.rendezvous_of(MODEL) is not rendezvous


def test_route_keys_cover_the_leading_messages_only() -> None:
    base = key_of(chat("sys", "first question"))
    assert key_of(chat("sys", "first question", "second")) == base
    assert key_of(chat("sys", "another first question")) != base
    assert key_of(chat("other sys", "first question")) != base
    # Only the first prefix_bytes of each message count.
    short = RoutePolicy(policy="prefix", prefix_bytes=16)
    assert key_of(chat("s", "0123456789abcdef-tail-one"), short) == key_of(
        chat("s", "0123456789abcdef-tail-two"), short
    )
    completion = msgspec.json.encode({"model": MODEL, "prompt": "Once upon a time"})
    assert key_of(completion).kind == "prefix"


def test_requests_with_nothing_to_key_on_have_no_key() -> None:
    least_loaded = RoutePolicy(policy="least_loaded")
    assert route_key(least_loaded, chat("s", "q"), b"session") is None
    assert route_key(PREFIX, b'{"model": "m", "messages": "not a list"}', None) is None
    assert route_key(PREFIX, b'{"model": "m"}', None) is None
    assert route_key(PREFIX, b"not json", None) is None


def test_a_key_reads_only_the_leading_messages_however_many_follow() -> None:
    # A million empty messages: a key built of the first four must not build the other
    # 999,996 first (it took 1.7 s of the gateway's loop and 900 MB for a 30 MiB body).
    tail = b",{}" * 1_000_000
    body = chat("sys", "first question")[:-2] + tail + b"]}"
    tracemalloc.start()
    try:
        key = key_of(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert key == key_of(chat("sys", "first question"))
    assert peak < len(body) // 4
    # The messages after the four the key reads are the engine's to judge.
    four = chat("sys", "first question", "second")
    assert key_of(four[:-2] + b',7,"x"]}') == key


def test_session_keys_are_read_from_the_sources_the_policy_names_in_order() -> None:
    body = msgspec.json.encode(
        {"model": MODEL, "prompt": "p", "user": "alice", "prompt_cache_key": "cache-1"}
    )
    header_first = key_of(body, SESSION, b"s-1")
    assert header_first == key_of(b'{"prompt": "q"}', SESSION, b"s-1")
    assert key_of(body, SESSION) == key_of(
        b'{"prompt_cache_key": "cache-1"}', SESSION
    )  # prompt_cache_key before user
    by_user = RoutePolicy(policy="session", session_keys=("user",))
    assert key_of(body, by_user, b"s-1") == key_of(b'{"user": "alice"}', by_user)
    no_sources = RoutePolicy(policy="session", session_keys=())
    assert key_of(body, no_sources, b"s-1").kind == "prefix"


async def test_an_ejected_home_hands_its_keys_to_the_next_replica_on_its_walk() -> None:
    policy = EjectionPolicy(consecutive_failures=2, base_cool_off_s=5.0, max_cool_off_s=40.0)
    router = Router(ejection=policy)
    router.update(table(*FOUR, policy=SESSION))
    session = key_of(chat("s", "q"), SESSION, b"conversation-7")
    home = (await router.acquire(MODEL, "k", route_key=session)).route.replica_id
    for _ in range(2):
        lease = await router.acquire(MODEL, "k", route_key=session)
        assert lease.route.replica_id == home
        lease.failed("unreachable")
        lease.release()
    moved = await router.acquire(MODEL, "k", route_key=session)
    assert moved.route.replica_id != home
    assert moved.reason == "unavailable"
    rendezvous = router.rendezvous_of(MODEL)
    assert rendezvous is not None
    assert moved.route.replica_id == list(rendezvous.walk(session.value))[1]


async def test_an_ejected_replica_takes_no_share_of_the_bound_from_those_left() -> None:
    # Three replicas, one ejected: the bound shares the load among the two that serve, as
    # if the ejected one had left. Counted in, its weight shrank their shares below what
    # they carry together, and every keyed request fell back to least-loaded.
    policy = EjectionPolicy(consecutive_failures=2, base_cool_off_s=5.0, max_cool_off_s=40.0)
    router = Router(ejection=policy)
    three = FOUR[:3]
    router.update(table(*three, policy=SESSION))
    session = key_of(chat("s", "q"), SESSION, b"conversation-9")
    rendezvous = router.rendezvous_of(MODEL)
    assert rendezvous is not None
    home, second, ejected = rendezvous.walk(session.value)
    for _ in range(2):
        lease = await router.acquire(MODEL, "k", exclude=frozenset({home, second}))
        assert lease.route.replica_id == ejected
        lease.failed("unreachable")
        lease.release()
    held = [await router.acquire(MODEL, "k", exclude=frozenset({second})) for _ in range(5)]
    held += [await router.acquire(MODEL, "k", exclude=frozenset({home})) for _ in range(4)]
    assert {lease.route.replica_id for lease in held} == {home, second}
    # 9 carried by the two: a bound of ceil(1.25 * 10 / 2) = 7 each, and the home has 5.
    lease = await router.acquire(MODEL, "k", route_key=session)
    assert (lease.route.replica_id, lease.reason) == (home, "home")
    # A retry that leaves the home out goes to the next on the walk, within its bound too.
    retry = await router.acquire(MODEL, "k", exclude=frozenset({home}), route_key=session)
    assert (retry.route.replica_id, retry.reason) == (second, "unavailable")


def test_an_empty_session_key_is_no_session_key() -> None:
    # "user": "" (or an empty prompt_cache_key) names no session, as an empty header does:
    # read as a key, it made one session of every such request, whatever its prompt.
    one = msgspec.json.encode({"model": MODEL, "user": "", "prompt": "Once upon a time"})
    two = msgspec.json.encode({"model": MODEL, "prompt_cache_key": "", "prompt": "Call me"})
    assert key_of(one, SESSION, b"") == key_of(one, PREFIX)
    assert key_of(two, SESSION) == key_of(two, PREFIX)
    assert key_of(one, SESSION) != key_of(two, SESSION)


def test_a_huge_role_or_session_key_is_read_only_as_far_as_the_key_goes() -> None:
    # A role (or a session key) of megabytes is cut like a message's content, not copied
    # and hashed whole: 30 MiB of role held the gateway's loop 14 times as long as 30 MiB
    # of content.
    huge = "x" * 8_000_000
    bodies = [
        msgspec.json.encode({"messages": [{"role": huge, "content": "q"}]}),
        msgspec.json.encode({"user": huge, "prompt": "p"}),
        msgspec.json.encode({"prompt_cache_key": huge, "prompt": "p"}),
    ]
    for body in bodies:
        tracemalloc.start()
        try:
            key = key_of(body, SESSION)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < len(body) // 4
        assert key == key_of(body.replace(huge.encode(), b"x" * 2000), SESSION)


async def test_an_engine_that_says_infinity_does_not_break_its_models_keyed_routing() -> None:
    # +Inf (or two figures whose sum overflows) is a reading of "full" for admission; the
    # bound adds the replicas' counts up, and an infinite total made its arithmetic raise
    # for every keyed request of the model, whichever replica was the key's home.
    clock = [100.0]
    router = Router(clock=lambda: clock[0])
    router.update(table(*FOUR))
    pages = (
        "vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n",
        "vllm:num_requests_waiting +Inf\n",
        'vllm:num_requests_running{engine="0"} 1e308\n'
        'vllm:num_requests_running{engine="1"} 1e308\n'
        "vllm:num_requests_waiting 0\n",
    )
    shouting, *others = (r.replica_id for r in FOUR)
    for page in pages:
        reading = read_engine_signals(page)
        assert reading is not None
        for replica_id in others:
            scraped(router, replica_id, waiting=0.0, running=0.0)
        router.replicas.reported(shouting, 1, reading)
        for n in range(20):
            lease = await router.acquire(MODEL, "k", route_key=key_of(chat("s", f"q{n}")))
            assert lease.route.replica_id != shouting, page
            lease.release()


async def test_an_engine_claiming_a_billion_waiting_does_not_keep_keys_on_full_homes() -> None:
    # Admission refuses the liar, but its count went whole into the model's total: every
    # other replica's bound rose with it, and a key stayed on its home however full.
    clock = [100.0]
    router = Router(clock=lambda: clock[0])
    three = tuple(route(f"m-{n}", target_waiting=4) for n in range(1, 4))
    router.update(table(*three))
    key = key_of(chat("s", "q"))
    rendezvous = router.rendezvous_of(MODEL)
    assert rendezvous is not None
    home, second, liar = rendezvous.walk(key.value)
    reading = read_engine_signals("vllm:num_requests_waiting 1e300\n")
    assert reading is not None
    scraped(router, home, waiting=0.0, running=10.0)
    scraped(router, second, waiting=0.0, running=0.0)
    router.replicas.reported(liar, 1, reading)
    # The liar counts as its target_waiting (4): 14 in all, a bound of ceil(1.25 * 15 / 3)
    # = 7, and the home's 10 is over it, as it would be with the liar idle.
    lease = await router.acquire(MODEL, "k", route_key=key)
    assert (lease.route.replica_id, lease.reason) == (second, "over_bound")


async def test_an_engine_claiming_a_billion_running_does_not_keep_keys_on_full_homes() -> None:
    # Its running count went whole into the model's total, which admission never refuses a
    # replica for: every other replica's bound rose with it, and keys stayed on full homes.
    clock = [100.0]
    router = Router(clock=lambda: clock[0])
    three = tuple(route(f"m-{n}", target_waiting=4) for n in range(1, 4))
    router.update(table(*three))
    key = key_of(chat("s", "q"))
    rendezvous = router.rendezvous_of(MODEL)
    assert rendezvous is not None
    home, second, liar = rendezvous.walk(key.value)
    reading = read_engine_signals("vllm:num_requests_waiting 0\nvllm:num_requests_running 1e9\n")
    assert reading is not None
    scraped(router, home, waiting=0.0, running=10.0)
    scraped(router, second, waiting=0.0, running=0.0)
    router.replicas.reported(liar, 1, reading)
    # The liar's running count is unusable and reads 0: 10 in all, a bound of
    # ceil(1.25 * 11 / 3) = 5, and the home's 10 is over it, as it would be with the liar idle.
    lease = await router.acquire(MODEL, "k", route_key=key)
    assert (lease.route.replica_id, lease.reason) == (second, "over_bound")
