"""The engine URLs a gateway routes to, followed by what each snapshot changed.

A gateway closes the connection pool of an engine it no longer routes to
(``app.gateway.engine_client.EngineClient``). Finding those by building the set of every
routed URL on each snapshot is a walk over the whole fleet, 1.3 ms at 20,000 routes, on
every read, when a read of changes touched one model (``app.gateway.held_routes``). So the
URLs are held per model, built again only for the models whose route tuple is not the one
seen (``models_changed``), and each URL counts the models that route to it, so a URL
leaves only when no model routes to it any more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from app.gateway.table import Route, models_changed


class RoutedUrls:
    """The engine URLs the last snapshot taken in routes to (``url in routed``)."""

    def __init__(self) -> None:
        self._routes: Mapping[str, tuple[Route, ...]] = {}
        self._urls: dict[str, frozenset[str]] = {}
        """Each model's URLs, from its routes in ``_routes``."""
        self._models_routing_to: Counter[str] = Counter()

    def __contains__(self, url: object) -> bool:
        return url in self._models_routing_to

    def __len__(self) -> int:
        return len(self._models_routing_to)

    def take(self, routes: Mapping[str, tuple[Route, ...]]) -> list[str]:
        """Follow ``routes`` (a snapshot's, by model); the URLs no model routes to now that
        one did before."""
        left: list[frozenset[str]] = []
        for model in models_changed(self._routes, routes):
            if (urls_before := self._urls.pop(model, None)) is not None:
                left.append(urls_before)
            if model in routes:
                urls = self._urls[model] = frozenset(route.url for route in routes[model])
                self._models_routing_to.update(urls)  # before any is let go: a URL may move
        self._routes = dict(routes)
        gone = []
        for urls in left:
            for url in urls:
                self._models_routing_to[url] -= 1
                if self._models_routing_to[url] <= 0:
                    del self._models_routing_to[url]
                    gone.append(url)
        return gone
