"""`llmgw-cli bench`'s first question to an engine, ``GET /v1/models``, failing in a way
that comes without a word: the error still says what happened."""

from __future__ import annotations

from typing import NoReturn, cast

import aiohttp
import pytest

from cli.bench.errors import TargetUnreachable
from cli.bench.probe import served_models


class CutOffSession:
    """A session whose every request fails as aiohttp fails an answer cut off, with an
    error whose text is empty."""

    def get(self, url: str, **options: object) -> NoReturn:
        raise aiohttp.ClientPayloadError()


async def test_an_error_without_text_is_named_by_its_kind() -> None:
    # Before, the reason was "{exc or ...}": an exception is always true, so the line
    # ended after "GET /v1/models: " with nothing.
    session = cast(aiohttp.ClientSession, CutOffSession())

    with pytest.raises(TargetUnreachable) as raised:
        await served_models(session, "http://engine.invalid:8000")

    assert str(raised.value) == (
        "the engine at http://engine.invalid:8000 did not answer GET /v1/models: ClientPayloadError"
    )
