"""``llmgw-server serve``'s flags: a negative adoption setting, or a time longer than a
day, is refused by name, the embedded gateway's ejection and upload flags are checked as
``llmgw-server gateway``'s are, and the agent hub's cap on handshakes per address comes
from its flag or its environment variable, within its bounds, as the admin listener's
keep-alive time does."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.bootstrap import Server
from app.gateway.ejection import EjectionPolicy
from app.gateway.engine_bounds import EngineTimeouts
from app.gateway.uploads import DEFAULT_MAX_UPLOAD_BYTES
from app.main import app
from app.settings import ServeSettings
from tests.support.admin_server import write_pki

DATABASE_URL = "postgresql://llmgw@db.example/llmgw"


def with_gateway(settings: ServeSettings, **changes: float) -> ServeSettings:
    """``settings`` with the embedded gateway's flags ``changes``."""
    return replace(settings, gateway_settings=replace(settings.gateway_settings, **changes))


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("adoption_grace", "--adoption-grace"),
        ("adoption_quiet", "--adoption-quiet"),
        ("adoption_grace_max", "--adoption-grace-max"),
    ],
)
def test_a_negative_adoption_setting_is_refused_by_its_flag(field: str, flag: str) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), **{field: -1.0})

    assert settings.problems() == [f"{flag} must not be negative, not -1.0"]


@pytest.mark.parametrize(
    ("field", "flag", "bound"),
    [
        ("heartbeat_interval", "--heartbeat-interval", "must be positive"),
        ("reconcile_interval", "--reconcile-interval", "must be positive"),
        ("lost_timeout", "--lost-timeout", "must not be negative"),
        ("adoption_grace_max", "--adoption-grace-max", "must not be negative"),
    ],
)
def test_a_time_that_is_not_a_number_is_refused_by_its_flag(
    field: str, flag: str, bound: str
) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), **{field: math.nan})

    assert settings.problems() == [f"{flag} {bound}, not nan"]


@pytest.mark.parametrize(
    "flag",
    [
        "--heartbeat-interval",
        "--reconcile-interval",
        "--adoption-grace",
        "--adoption-quiet",
        "--adoption-grace-max",
        "--lost-timeout",
        "--stability-window",
        "--drain-idle-timeout",
    ],
)
@pytest.mark.parametrize("value", [math.inf, 1e308, 86400.5])
def test_a_time_longer_than_a_day_is_refused_by_its_flag(flag: str, value: float) -> None:
    """Each pass turns these into time spans: infinity or 1e308 overflowed them, and a
    leader started with one failed every pass, reconciling nothing, for as long as it led."""
    field = flag.removeprefix("--").replace("-", "_")
    settings = replace(ServeSettings(database_url=DATABASE_URL), **{field: value})

    assert settings.problems() == [f"{flag} must be at most 86400 seconds, not {value:g}"]


def test_a_day_is_still_a_usable_time() -> None:
    settings = ServeSettings(
        database_url=DATABASE_URL, lost_timeout=86400.0, adoption_grace_max=86400.0
    )

    assert settings.problems() == []


def test_the_adoption_defaults_are_usable() -> None:
    settings = ServeSettings(database_url=DATABASE_URL)

    assert settings.problems() == []
    assert (settings.adoption_grace, settings.adoption_quiet, settings.adoption_grace_max) == (
        30.0,
        10.0,
        600.0,
    )


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"eject_after_failures": -1}, "--eject-after-failures must not be negative, not -1"),
        ({"ejection_cool_off": 0.0}, "--ejection-cool-off must be positive, not 0.0"),
        (
            {"max_ejection_cool_off": 1.0},
            "--max-ejection-cool-off (1.0) must be at least --ejection-cool-off (5.0)",
        ),
        ({"max_ejected_percent": 101}, "--max-ejected-percent must be between 0 and 100, not 101"),
        ({"max_upload_mib": 0}, "--max-upload-mib must be between 1 and 16384, not 0"),
    ],
)
def test_the_embedded_gateway_s_ejection_and_upload_flags_are_checked_like_the_gateway_s(
    changes: dict[str, float], problem: str
) -> None:
    settings = with_gateway(ServeSettings(database_url=DATABASE_URL), **changes)

    assert settings.problems() == [problem]
    assert replace(settings, gateway=False).problems() == [], "no gateway, nothing to check"


def test_the_embedded_gateway_ejects_and_bounds_uploads_as_a_standalone_one_by_default() -> None:
    gateway = with_gateway(
        ServeSettings(database_url=DATABASE_URL), eject_after_failures=5, max_upload_mib=8
    ).gateway_settings
    default = ServeSettings(database_url=DATABASE_URL).gateway_settings

    assert gateway.ejection_policy() == replace(EjectionPolicy(), consecutive_failures=5)
    assert gateway.max_upload_bytes == 8 << 20
    assert default.ejection_policy() == EjectionPolicy()
    assert default.max_upload_bytes == DEFAULT_MAX_UPLOAD_BYTES


@pytest.mark.parametrize("lease", [6.0, 0.0, -1.0, float("nan"), float("inf"), 3601.0])
def test_a_leader_lease_a_cut_off_leader_could_outlive_or_that_never_ends_is_refused(
    lease: float,
) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), leader_lease=lease)

    [problem] = settings.problems()
    assert problem.startswith(f"--leader-lease: the leader lease ({lease:g}s) must be longer")
    assert "at most 3600s" in problem


def test_the_leader_lease_is_ten_seconds_unless_set() -> None:
    assert ServeSettings(database_url=DATABASE_URL).leader_lease == 10.0
    assert replace(ServeSettings(database_url=DATABASE_URL), leader_lease=7.5).problems() == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"agent_connect_burst": 0}, "--agent-connect-burst must be at least 1, not 0"),
        (
            {"agent_connects_per_minute": -1.0},
            "--agent-connects-per-minute must be positive, not -1",
        ),
    ],
)
def test_a_connect_budget_that_lets_no_node_connect_is_refused_by_its_flag(
    changes: dict[str, float], problem: str
) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), **changes)

    assert settings.problems() == [problem]


def test_a_node_connects_ten_times_at_once_and_ten_a_minute_unless_set() -> None:
    settings = ServeSettings(database_url=DATABASE_URL)

    assert (settings.agent_connect_burst, settings.agent_connects_per_minute) == (10, 10.0)


def serve_settings(*flags: str) -> ServeSettings:
    """``llmgw-server serve``'s settings as the program parses ``flags``."""
    _, bound, _ = app.parse_args(
        ["serve", "--database-url", DATABASE_URL, *flags], exit_on_error=False, print_error=False
    )
    settings = bound.arguments["settings"]
    assert isinstance(settings, ServeSettings)
    return settings


FILE_FLAGS = [
    ("--tls-cert", "LLMGW_TLS_CERT"),
    ("--tls-key", "LLMGW_TLS_KEY"),
    ("--tls-ca", "LLMGW_TLS_CA"),
    ("--admin-tls-cert", "LLMGW_ADMIN_TLS_CERT"),
    ("--admin-tls-key", "LLMGW_ADMIN_TLS_KEY"),
    ("--admin-ca", "LLMGW_ADMIN_CA"),
]


@pytest.mark.parametrize("empty", ["", "  "])
@pytest.mark.parametrize(("flag", "env_var"), FILE_FLAGS)
def test_a_file_variable_set_empty_is_bad_usage_naming_it_not_the_current_directory(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    env_var: str,
    empty: str,
) -> None:
    monkeypatch.setenv(env_var, empty)

    with pytest.raises(SystemExit) as ended:
        app.parse_args(["serve", "--database-url", DATABASE_URL])

    assert ended.value.code == 2
    assert f"{flag} ({env_var}) is empty: give a path, or unset it" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "env_var"), FILE_FLAGS)
def test_a_file_flag_given_empty_is_bad_usage_naming_it_not_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str, env_var: str
) -> None:
    monkeypatch.delenv(env_var, raising=False)

    with pytest.raises(SystemExit) as ended:
        app.parse_args(["serve", "--database-url", DATABASE_URL, flag, ""])

    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} ({env_var}) is empty: give a path, or leave the flag out" in err


def test_a_file_flag_comes_from_the_flag_over_its_variable_and_a_given_one_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMGW_TLS_CA", "/etc/llmgw/ca.crt")
    monkeypatch.setenv("LLMGW_TLS_CERT", "")

    settings = serve_settings("--tls-cert", "server.crt")

    assert (settings.tls_cert, settings.tls_ca) == (Path("server.crt"), Path("/etc/llmgw/ca.crt"))


def test_the_agent_handshakes_per_address_come_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LLMGW_AGENT_HANDSHAKES_PER_ADDRESS", raising=False)
    assert serve_settings().agent_handshakes_per_address == 8
    assert serve_settings("--agent-handshakes-per-address", "64").agent_handshakes_per_address == 64

    monkeypatch.setenv("LLMGW_AGENT_HANDSHAKES_PER_ADDRESS", "4096")

    assert serve_settings().agent_handshakes_per_address == 4096


@pytest.mark.parametrize("cap", [0, -3, 65536])
def test_agent_handshakes_per_address_outside_their_bounds_are_refused(cap: int) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), agent_handshakes_per_address=cap)

    assert settings.problems() == [
        f"--agent-handshakes-per-address must be between 1 and 65535, not {cap}"
    ]


def test_the_embedded_gateway_s_engine_timeouts_come_from_the_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LLMGW_ENGINE_HEAD_TIMEOUT", raising=False)
    monkeypatch.delenv("LLMGW_ENGINE_IDLE_TIMEOUT", raising=False)
    assert serve_settings().gateway_settings.engine_timeouts() == EngineTimeouts(
        head_s=600.0, idle_s=120.0
    )
    flags = ("--engine-head-timeout", "30", "--engine-idle-timeout", "5")
    assert serve_settings(*flags).gateway_settings.engine_timeouts() == EngineTimeouts(
        head_s=30.0, idle_s=5.0
    )

    monkeypatch.setenv("LLMGW_ENGINE_IDLE_TIMEOUT", "9.5")

    assert serve_settings().gateway_settings.engine_timeouts().idle_s == 9.5


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"engine_head_timeout": 0.0},
            "--engine-head-timeout must be more than 0 and at most 86400 seconds, not 0",
        ),
        (
            {"engine_idle_timeout": float("inf")},
            "--engine-idle-timeout must be more than 0 and at most 86400 seconds, not inf",
        ),
        (
            {"engine_idle_timeout": float("nan")},
            "--engine-idle-timeout must be more than 0 and at most 86400 seconds, not nan",
        ),
    ],
)
def test_engine_timeouts_out_of_bounds_are_refused_by_their_flag(
    changes: dict[str, float], problem: str
) -> None:
    settings = with_gateway(ServeSettings(database_url=DATABASE_URL), **changes)

    assert settings.problems() == [problem]
    assert replace(settings, gateway=False).problems() == [], "no gateway, nothing to check"


def test_the_admin_keep_alive_timeout_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LLMGW_ADMIN_KEEP_ALIVE_TIMEOUT", raising=False)
    assert serve_settings().admin_keep_alive_timeout == 5.0
    assert serve_settings("--admin-keep-alive-timeout", "75").admin_keep_alive_timeout == 75.0

    monkeypatch.setenv("LLMGW_ADMIN_KEEP_ALIVE_TIMEOUT", "0.5")

    assert serve_settings().admin_keep_alive_timeout == 0.5


def test_serve_gives_its_admin_listener_the_keep_alive_timeout(tmp_path: Path) -> None:
    pki = write_pki(tmp_path, "alice", "gpu-01")
    cert, key = pki.pair("server")
    settings = ServeSettings(
        database_url=DATABASE_URL,
        tls_cert=cert,
        tls_key=key,
        tls_ca=pki.ca,
        admin_keep_alive_timeout=75.0,
    )

    assert Server.from_settings(settings).admin_keep_alive_s == 75.0


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan])
def test_an_admin_keep_alive_timeout_that_is_not_positive_is_refused(seconds: float) -> None:
    settings = replace(ServeSettings(database_url=DATABASE_URL), admin_keep_alive_timeout=seconds)

    assert settings.problems() == [f"--admin-keep-alive-timeout must be positive, not {seconds}"]
