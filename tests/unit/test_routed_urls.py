"""The engine URLs a gateway routes to, followed snapshot by snapshot: after each, what it
holds is every URL the snapshot routes to, and what it lets go is what the one before
routed to and this one does not, whichever models the URLs were routed for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.gateway.routed_urls import RoutedUrls
from app.gateway.table import Route

MODELS = ("llama", "qwen", "mistral")
URLS = tuple(f"http://127.0.0.1:{20000 + i}" for i in range(5))


def route(model: str, url: str) -> Route:
    return Route(replica_id=f"{model}-{url[-1]}", model=model, url=url)


def urls_of(routes: dict[str, tuple[Route, ...]]) -> set[str]:
    return {r.url for model_routes in routes.values() for r in model_routes}


snapshots = st.lists(
    st.dictionaries(
        st.sampled_from(MODELS),
        st.one_of(st.none(), st.frozensets(st.sampled_from(URLS), min_size=1)),
    ),
    max_size=12,
)
"""Each snapshot by its models: None keeps the model's tuple from the snapshot before (the
same object, as a read that did not touch it keeps it), a set of URLs gives it new routes;
a model left out is gone."""


@settings(max_examples=200, deadline=None)
@given(snapshots)
def test_what_is_held_and_let_go_follows_every_snapshot(steps: list[dict[str, object]]) -> None:
    routed = RoutedUrls()
    before: dict[str, tuple[Route, ...]] = {}
    for step in steps:
        routes: dict[str, tuple[Route, ...]] = {}
        for model, urls in step.items():
            if urls is None:
                if model in before:
                    routes[model] = before[model]
            else:
                assert isinstance(urls, frozenset)
                routes[model] = tuple(route(model, url) for url in sorted(urls))

        gone = routed.take(routes)

        assert sorted(gone) == sorted(urls_of(before) - urls_of(routes))
        assert {url for url in URLS if url in routed} == urls_of(routes)
        assert len(routed) == len(urls_of(routes))
        before = routes


def test_a_url_moving_from_one_model_to_another_is_not_let_go() -> None:
    routed = RoutedUrls()
    url = URLS[0]
    routed.take({"llama": (route("llama", url),)})

    assert routed.take({"qwen": (route("qwen", url),)}) == []
    assert url in routed


def test_a_model_whose_tuple_is_the_one_seen_is_passed_over() -> None:
    routed = RoutedUrls()
    llama = (route("llama", URLS[0]),)
    routed.take({"llama": llama})

    assert routed.take({"llama": llama, "qwen": (route("qwen", URLS[1]),)}) == []
    assert routed.take({"qwen": (route("qwen", URLS[1]),)}) == [URLS[0]]
