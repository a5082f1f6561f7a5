"""A gateway's flags are declared once: ``llmgw-server gateway`` and ``llmgw-server serve``
read the same flags and variables into the same settings and build their gateway from them
alike, each listening where flags of its own names say."""

from __future__ import annotations

from pathlib import Path

import pytest
from cyclopts import CycloptsError

from app.bootstrap import Server, SettingsError
from app.commands.gateway import StandaloneGatewaySettings
from app.commands.gateway_settings import GatewaySettings
from app.domain.egress import EngineNetworks
from app.gateway.ejection import EjectionPolicy
from app.gateway.engine_bounds import EngineTimeouts
from app.gateway.postgres import GatewayOptions
from app.listeners.throttle import FailureLimits
from app.main import app
from app.settings import ServeSettings
from tests.support.fake_agents import make_pki

DATABASE_URL = "postgresql://llmgw@db.example/llmgw"

GATEWAY_FLAGS = (
    *("--engine-networks", "127.20.0.0/16"),
    *("--eject-after-failures", "7", "--ejection-cool-off", "2"),
    *("--max-ejection-cool-off", "20", "--max-ejected-percent", "30"),
    *("--auth-failure-burst", "4"),
    *("--header-timeout", "3", "--body-timeout", "4", "--send-timeout", "5"),
    *("--engine-head-timeout", "30", "--max-upload-mib", "8"),
    *("--shutdown-grace", "12"),
)
TLS_FILES = (("cert", "server.crt"), ("key", "server.key"), ("ca", "ca.crt"))
GATEWAY_VARIABLES = {"LLMGW_AUTH_FAILURES_PER_MINUTE": "6", "LLMGW_ENGINE_IDLE_TIMEOUT": "9.5"}
GIVEN = GatewaySettings(
    engine_networks="127.20.0.0/16",
    eject_after_failures=7,
    ejection_cool_off=2.0,
    max_ejection_cool_off=20.0,
    max_ejected_percent=30,
    auth_failure_burst=4,
    auth_failures_per_minute=6.0,
    header_timeout=3.0,
    body_timeout=4.0,
    send_timeout=5.0,
    engine_head_timeout=30.0,
    engine_idle_timeout=9.5,
    max_upload_mib=8,
    shutdown_grace=12.0,
)


def parsed(command: str, *flags: str) -> object:
    """The settings ``llmgw-server COMMAND`` parses from ``flags``."""
    argv = [command, "--database-url", DATABASE_URL, *flags]
    _, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=False)
    return bound.arguments["settings"]


@pytest.fixture
def gateway_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in GATEWAY_VARIABLES.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("gateway_variables")
def test_both_commands_read_the_gateway_s_flags_and_variables_into_the_same_settings() -> None:
    standalone = parsed("gateway", *GATEWAY_FLAGS)
    embedded = parsed("serve", *GATEWAY_FLAGS)

    assert isinstance(standalone, StandaloneGatewaySettings)
    assert isinstance(embedded, ServeSettings)
    assert standalone.gateway_settings == embedded.gateway_settings == GIVEN


@pytest.mark.usefixtures("gateway_variables")
def test_both_commands_build_their_gateway_alike_each_where_its_own_flags_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_pki(tmp_path)
    monkeypatch.setenv("LLMGW_GATEWAY_HOST", "127.0.0.5")
    monkeypatch.setenv("LLMGW_CLIENT_HOST", "127.0.0.6")
    networks = EngineNetworks.parse("127.20.0.0/16")
    standalone = parsed("gateway", *GATEWAY_FLAGS, "--port", "9000", "--max-connections", "100")
    assert isinstance(standalone, StandaloneGatewaySettings)
    serve_flags = ("--client-port", "9001", "--client-max-connections", "200", "--server-id", "s1")
    pki = [f"--tls-{part}={tmp_path / name}" for part, name in TLS_FILES]
    embedded = parsed("serve", *GATEWAY_FLAGS, *serve_flags, *pki)
    assert isinstance(embedded, ServeSettings)

    alone = standalone.options(networks)
    within = Server.from_settings(embedded).gateway

    assert within is not None
    for options in (alone, within):
        assert options.engine_networks == networks
        assert options.ejection == EjectionPolicy(
            consecutive_failures=7, base_cool_off_s=2.0, max_cool_off_s=20.0, max_ejected_percent=30
        )
        assert options.auth_failures == FailureLimits(burst=4, per_minute=6.0)
        limits = options.limits
        assert (limits.header_timeout_s, limits.body_timeout_s, limits.send_timeout_s) == (3, 4, 5)
        assert options.engine_timeouts == EngineTimeouts(head_s=30.0, idle_s=9.5)
        assert options.max_upload_bytes == 8 << 20
        assert options.shutdown_grace_s == 12.0
    assert (alone.host, alone.port, alone.limits.max_connections) == ("127.0.0.5", 9000, 100)
    assert (within.host, within.port, within.limits.max_connections) == ("127.0.0.6", 9001, 200)
    assert within.gateway_id == "s1"
    defaults = GatewayOptions()
    assert (within.queue_timeout_s, within.refresh_interval_s, within.metrics_port) == (
        defaults.queue_timeout_s,
        defaults.refresh_interval_s,
        None,
    ), "what only a standalone gateway has keeps its defaults, and no /metrics listener"


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("serve", "--host"),
        ("serve", "--port"),
        ("serve", "--max-connections"),
        ("serve", "--queue-timeout"),
        ("serve", "--refresh-interval"),
        ("serve", "--metrics-port"),
        ("gateway", "--client-host"),
        ("gateway", "--client-port"),
        ("gateway", "--client-max-connections"),
    ],
)
def test_each_command_keeps_its_own_names_for_where_its_gateway_listens(
    command: str, flag: str
) -> None:
    with pytest.raises(CycloptsError, match="Unknown option"):
        parsed(command, flag, "1")


def test_serve_names_the_engine_networks_flag_it_refuses_as_the_gateway_does(
    tmp_path: Path,
) -> None:
    make_pki(tmp_path)
    pki = [f"--tls-{part}={tmp_path / name}" for part, name in TLS_FILES]
    embedded = parsed("serve", "--engine-networks", "127.20.0.0/33", "--server-id", "s1", *pki)
    assert isinstance(embedded, ServeSettings)

    with pytest.raises(SettingsError) as refused:
        Server.from_settings(embedded)

    assert str(refused.value).startswith("--engine-networks: invalid engine networks: ")


def test_serve_s_admin_listener_stops_within_a_shorter_shutdown_grace(tmp_path: Path) -> None:
    """The admin listener's requests get 3 s once serve stops; with a shorter
    --shutdown-grace they held the process past it."""
    make_pki(tmp_path)
    pki = [f"--tls-{part}={tmp_path / name}" for part, name in TLS_FILES]

    def admin_grace(*flags: str) -> int:
        embedded = parsed("serve", "--server-id", "s1", *pki, *flags)
        assert isinstance(embedded, ServeSettings)
        return Server.from_settings(embedded).admin_shutdown_grace_s

    assert admin_grace() == 3
    assert admin_grace("--shutdown-grace", "600") == 3
    assert admin_grace("--shutdown-grace", "1") == 1
    assert admin_grace("--shutdown-grace", "0.5") == 1
    assert admin_grace("--shutdown-grace", "0") == 0
    assert admin_grace("--no-gateway", "--shutdown-grace", "1") == 1
    with pytest.raises(SettingsError, match="--shutdown-grace must be between 0 and 86400"):
        admin_grace("--no-gateway", "--shutdown-grace=-1")
