"""The engine's root, whatever form of its URL the operator gives."""

from __future__ import annotations

import pytest

from cli.bench.target import Engine, engine_root


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://127.0.0.7:8001", "http://127.0.0.7:8001"),
        ("http://127.0.0.7:8001/", "http://127.0.0.7:8001"),
        ("http://127.0.0.7:8001/v1", "http://127.0.0.7:8001"),
        ("https://engines.internal/llama/v1/", "https://engines.internal/llama"),
        ("http://[::1]:8001/v1", "http://[::1]:8001"),
    ],
)
def test_an_openai_base_url_and_the_engine_root_are_the_same_engine(given: str, root: str) -> None:
    assert engine_root(given) == root


@pytest.mark.parametrize("given", ["127.0.0.7:8001", "ftp://host/v1", "http://"])
def test_a_url_that_names_no_http_server_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="expected http://HOST:PORT"):
        engine_root(given)


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("http://127.0.0.7:99999", "Port out of range 0-65535"),
        ("http://127.0.0.7:abc/v1", "Port could not be cast to integer value as 'abc'"),
        ("http://[127.0.0.7:8001", "Invalid IPv6 URL"),
    ],
)
def test_a_url_whose_port_or_address_is_none_is_refused_naming_the_flag(
    given: str, why: str
) -> None:
    with pytest.raises(ValueError, match=r"^--url ") as refused:
        engine_root(given)

    assert str(refused.value) == (
        f"--url {given!r}: {why}; expected http://HOST:PORT or an OpenAI base URL ending in /v1"
    )


def test_the_engine_answers_under_its_root() -> None:
    completions = Engine("http://h:8001", "m")
    chat = Engine("http://h:8001", "m", api="chat")

    assert completions.generation_url == "http://h:8001/v1/completions"
    assert chat.generation_url == "http://h:8001/v1/chat/completions"
    assert chat.metrics_url == "http://h:8001/metrics"
