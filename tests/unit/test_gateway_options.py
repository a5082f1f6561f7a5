"""The standalone gateway's options name the flag that is wrong."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from app.commands.gateway import StandaloneGatewaySettings
from app.commands.gateway_settings import gateway_options
from app.gateway.engine_bounds import EngineTimeouts
from app.gateway.postgres import GatewayOptions
from app.gateway.uploads import DEFAULT_MAX_UPLOAD_BYTES
from app.main import app
from app.settings import ServeSettings


def test_the_default_upload_limit_is_accepted() -> None:
    assert GatewayOptions().max_upload_bytes == DEFAULT_MAX_UPLOAD_BYTES
    assert GatewayOptions().problems() == []


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0])
def test_a_queue_timeout_that_is_no_time_is_refused_by_its_flag(seconds: float) -> None:
    [problem] = GatewayOptions(queue_timeout_s=seconds).problems()
    assert problem == (
        f"--queue-timeout must be a finite number of seconds, 0 or more, not {seconds}"
    )


@pytest.mark.parametrize("seconds", [math.nan, math.inf, 0.0])
def test_a_scrape_or_refresh_interval_that_is_no_time_is_refused_by_its_flag(
    seconds: float,
) -> None:
    assert GatewayOptions(scrape_interval_s=seconds, refresh_interval_s=seconds).problems() == [
        f"--scrape-interval must be a finite number of seconds above 0, not {seconds}",
        f"--refresh-interval must be a finite number of seconds above 0, not {seconds}",
    ]


@pytest.mark.parametrize("seconds", [86400.5, 1e308])
def test_a_scrape_or_refresh_interval_longer_than_a_day_is_refused_by_its_flag(
    seconds: float,
) -> None:
    """1e308 is finite, but four scrape intervals (a 429's Retry-After) are not: the gateway
    took it and then died at start with a traceback, exit code 1."""
    assert GatewayOptions(scrape_interval_s=seconds, refresh_interval_s=seconds).problems() == [
        f"--scrape-interval must be at most 86400 seconds, not {seconds:g}",
        f"--refresh-interval must be at most 86400 seconds, not {seconds:g}",
    ]


@pytest.mark.parametrize("mib", [0, -1, 1 << 20])
def test_an_upload_limit_out_of_bounds_names_its_flag(mib: int) -> None:
    [problem] = GatewayOptions(max_upload_bytes=mib << 20).problems()
    assert problem.startswith("--max-upload-mib must be between 1 and 16384, not ")


def test_engine_timeouts_are_checked_by_their_flags() -> None:
    options = GatewayOptions(engine_timeouts=EngineTimeouts(head_s=-1, idle_s=86401))

    assert options.problems() == [
        "--engine-head-timeout must be more than 0 and at most 86400 seconds, not -1",
        "--engine-idle-timeout must be more than 0 and at most 86400 seconds, not 86401",
    ]
    assert GatewayOptions().engine_timeouts == EngineTimeouts(head_s=600, idle_s=120)


def test_the_gateway_command_takes_the_engine_timeouts_from_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def parsed(*flags: str) -> StandaloneGatewaySettings:
        argv = ["gateway", "--database-url", "postgresql://llmgw@db/llmgw", *flags]
        _, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=False)
        settings = bound.arguments["settings"]
        assert isinstance(settings, StandaloneGatewaySettings)
        return settings

    monkeypatch.delenv("LLMGW_ENGINE_HEAD_TIMEOUT", raising=False)
    monkeypatch.setenv("LLMGW_ENGINE_IDLE_TIMEOUT", "7.5")

    options = parsed("--engine-head-timeout", "30").options(engine_networks=None)

    assert options.engine_timeouts == EngineTimeouts(head_s=30.0, idle_s=7.5)


GIVE_A_NAME = "give a name, or leave it unset for the default"


@pytest.mark.parametrize(
    ("gateway_id", "problem"),
    [
        ("gw-1@abc", "--gateway-id must not contain '@' (it marks a twin's reports: ID@INSTANCE)"),
        ("gw\x1b[2J", "--gateway-id must be printable: 'gw\\x1b[2J'"),
        ("g" * 201, "--gateway-id is at most 200 characters, not 201"),
        # Said by its length, not repeated whole in escapes four times as long.
        ("\x07" * 100_000, "--gateway-id is at most 200 characters, not 100000"),
        ("", "--gateway-id (or LLMGW_GATEWAY_ID) is blank: " + GIVE_A_NAME),
        ("   ", "--gateway-id (or LLMGW_GATEWAY_ID) is blank: " + GIVE_A_NAME),
    ],
)
def test_a_gateway_id_that_would_read_as_another_s_twin_or_garble_a_log_is_refused(
    gateway_id: str, problem: str
) -> None:
    assert GatewayOptions(gateway_id=gateway_id).problems() == [problem]
    assert GatewayOptions(gateway_id="gw-1.example-9").problems() == []


def test_serve_refuses_a_server_id_its_gateway_would_report_under_as_a_twin() -> None:
    settings = ServeSettings(database_url="postgresql://llmgw@db.example/llmgw", server_id="s@1")

    assert settings.problems() == [
        "--server-id must not contain '@' (it marks a twin's reports: ID@INSTANCE)"
    ]
    assert replace(settings, gateway=False).problems() == [], "no gateway, no reports"


def test_serve_refuses_a_blank_server_id_with_a_gateway_or_without() -> None:
    settings = ServeSettings(database_url="postgresql://llmgw@db.example/llmgw", server_id=" ")
    blank = "--server-id (or LLMGW_SERVER_ID) is blank: " + GIVE_A_NAME

    assert settings.problems() == [blank]
    assert replace(settings, gateway=False).problems() == [blank]
    assert replace(settings, server_id=None).problems() == [], "left out: hostname:pid"


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0, 86400.5, 1e308])
def test_a_shutdown_grace_that_is_no_time_or_over_a_day_is_refused_by_its_flag(
    seconds: float,
) -> None:
    """NaN passes every comparison and an infinite grace never ends: the gateway would not
    stop before whatever runs it killed it."""
    assert GatewayOptions(shutdown_grace_s=seconds).problems() == [
        f"--shutdown-grace must be between 0 and 86400 seconds, not {seconds:g}"
    ]


def test_both_commands_take_the_shutdown_grace_from_a_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def options(command: str, *flags: str) -> GatewayOptions:
        argv = [command, "--database-url", "postgresql://llmgw@db/llmgw", *flags]
        _, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=False)
        settings = bound.arguments["settings"]
        if isinstance(settings, StandaloneGatewaySettings):
            return settings.options(engine_networks=None)
        assert isinstance(settings, ServeSettings)
        assert settings.problems() == []
        return gateway_options(settings.gateway_settings, None, max_connections=1)

    monkeypatch.delenv("LLMGW_SHUTDOWN_GRACE", raising=False)
    for command in ("gateway", "serve"):
        assert options(command).shutdown_grace_s == 30.0
        assert options(command, "--shutdown-grace", "0").shutdown_grace_s == 0.0
        assert options(command, "--shutdown-grace", "25.5").shutdown_grace_s == 25.5

    monkeypatch.setenv("LLMGW_SHUTDOWN_GRACE", "120")

    assert options("gateway").shutdown_grace_s == 120.0
    assert options("serve").shutdown_grace_s == 120.0
