"""The agent's settings: flags over ``LLMGW_AGENT_*`` over the TOML file over defaults, and
the messages that say what is wrong."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.command_line import EXIT_OK, EXIT_USAGE
from agent.config import (
    DEFAULT_PORT_RANGE,
    DEFAULT_RECONNECT_MAX_DELAY_S,
    AgentSettings,
    default_state_dir,
)
from agent.config_sources import load_config
from agent.config_values import ConfigError, ServerAddress
from agent.engines.readiness import Liveness
from agent.gpus.fake_health import read_health_file
from agent.main import app


@pytest.fixture
def node_files(tmp_path: Path) -> Path:
    """A folder with the three PEM files an agent needs (their content is not read here)."""
    for name in ("node.crt", "node.key", "ca.crt"):
        (tmp_path / name).write_text("PEM\n")
    return tmp_path


def flags(files: Path, **overrides: Any) -> AgentSettings:
    """Complete flags, with ``overrides`` (values of several field types) replacing some."""
    complete = AgentSettings(
        servers=("wss://127.0.0.5:8443",),
        node_id="gpu-07",
        cert=files / "node.crt",
        key=files / "node.key",
        ca=files / "ca.crt",
    )
    return dataclasses.replace(complete, **overrides)


def write_config(directory: Path, text: str) -> Path:
    path = directory / "agent.toml"
    path.write_text(text)
    return path


# -- precedence --------------------------------------------------------------------------


def test_a_flag_beats_the_environment_which_beats_the_file(node_files: Path) -> None:
    config_file = write_config(
        node_files,
        'node_id = "from-file"\naddress = "127.0.0.9"\nlog_level = "warning"\n'
        'labels = { zone = "file" }\n',
    )
    environ = {
        "LLMGW_AGENT_NODE_ID": "from-env",
        "LLMGW_AGENT_LOG_LEVEL": "debug",
        "LLMGW_AGENT_LABELS": "zone=env,rack=7",
    }

    config = load_config(flags(node_files, node_id="from-flag"), environ, config_file)

    assert config.node_id == "from-flag"
    assert config.log_level == "debug"
    assert config.address == "127.0.0.9"
    assert config.labels == {"zone": "env", "rack": "7"}, "a list is replaced, never merged"
    assert config.port_range == DEFAULT_PORT_RANGE


def test_everything_can_come_from_a_file_named_by_the_environment(tmp_path: Path) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    for name in ("gpu-07.crt", "gpu-07.key", "ca.crt"):
        (folder / name).write_text("PEM\n")
    config_file = write_config(
        folder,
        'servers = ["wss://cp-1:8443", "wss://[::1]/agent"]\nnode_id = "gpu-07"\n'
        'cert = "gpu-07.crt"\nkey = "gpu-07.key"\nca = "ca.crt"\nstate_dir = "state"\n'
        'fake_gpus = "4x80GB"\nport_range = [21000, 21099]\nreconnect_max_delay = 5\n',
    )

    config = load_config(AgentSettings(), {"LLMGW_AGENT_CONFIG": str(config_file)})

    assert config.servers == (
        ServerAddress("wss://cp-1:8443", "cp-1", 8443),
        ServerAddress("wss://[::1]/agent", "::1", 443),
    )
    assert config.cert == folder / "gpu-07.crt", "relative paths are read from the file's folder"
    assert config.state_dir == folder / "state"
    assert config.fake_gpu_health_file == folder / "state" / "fake-gpu-health.json"
    assert config.fake_gpus == "4x80GB"
    assert config.port_range == (21000, 21099)
    assert config.reconnect_max_delay_s == 5.0


def test_servers_and_labels_come_from_the_environment_as_lists(node_files: Path) -> None:
    environ = {
        "LLMGW_AGENT_SERVERS": "wss://cp-1:8443, wss://cp-2:8443",
        "LLMGW_AGENT_PORT_RANGE": "30000-30010",
    }

    config = load_config(flags(node_files, servers=None), environ)

    assert [server.host for server in config.servers] == ["cp-1", "cp-2"]
    assert config.port_range == (30000, 30010)
    assert config.reconnect_max_delay_s == DEFAULT_RECONNECT_MAX_DELAY_S


def test_the_dial_timeouts_default_short_for_tcp_and_long_for_the_handshakes(
    node_files: Path,
) -> None:
    config = load_config(flags(node_files), {})
    assert (config.connect_timeout_s, config.open_timeout_s) == (5.0, 30.0)

    config = load_config(
        flags(node_files, open_timeout=60.0),
        {"LLMGW_AGENT_CONNECT_TIMEOUT": "2", "LLMGW_AGENT_OPEN_TIMEOUT": "45"},
    )
    assert (config.connect_timeout_s, config.open_timeout_s) == (2.0, 60.0)


def test_the_next_server_is_dialled_too_after_five_seconds_unless_told(node_files: Path) -> None:
    assert load_config(flags(node_files), {}).next_server_after_s == 5.0
    environ = {"LLMGW_AGENT_NEXT_SERVER_AFTER": "2.5"}
    assert load_config(flags(node_files), environ).next_server_after_s == 2.5
    told = flags(node_files, next_server_after=1.0)
    assert load_config(told, environ).next_server_after_s == 1.0


def test_the_reconnect_delay_cap_comes_from_the_environment_in_seconds(node_files: Path) -> None:
    config = load_config(flags(node_files), {"LLMGW_AGENT_RECONNECT_MAX_DELAY": "1.5"})

    assert config.reconnect_max_delay_s == 1.5
    with pytest.raises(ConfigError, match="LLMGW_AGENT_RECONNECT_MAX_DELAY 'soon': expected"):
        load_config(flags(node_files), {"LLMGW_AGENT_RECONNECT_MAX_DELAY": "soon"})


def test_serving_engines_are_checked_every_ten_seconds_ended_after_three_misses(
    node_files: Path,
) -> None:
    assert load_config(flags(node_files), {}).liveness == Liveness(interval_s=10.0, failures=3)
    environ = {"LLMGW_AGENT_LIVENESS_INTERVAL": "0", "LLMGW_AGENT_LIVENESS_FAILURES": "5"}
    assert load_config(flags(node_files), environ).liveness == Liveness(0.0, 5)
    assert not Liveness(0.0, 5).checked
    told = flags(node_files, liveness_interval=2.5, liveness_failures=2)
    assert load_config(told, environ).liveness == Liveness(2.5, 2)
    config_file = write_config(node_files, "liveness_interval = 30\nliveness_failures = 4\n")
    assert load_config(flags(node_files), {}, config_file).liveness == Liveness(30.0, 4)
    with pytest.raises(ConfigError, match="LLMGW_AGENT_LIVENESS_FAILURES 'many': expected"):
        load_config(flags(node_files), {"LLMGW_AGENT_LIVENESS_FAILURES": "many"})


@pytest.mark.parametrize(
    ("is_root", "environ", "expected"),
    [
        (True, {"XDG_STATE_HOME": "/home/op/.state"}, Path("/var/lib/llmgw-agent")),
        (False, {"XDG_STATE_HOME": "/home/op/.state"}, Path("/home/op/.state/llmgw-agent")),
    ],
)
def test_the_state_directory_defaults_by_who_runs_the_agent(
    is_root: bool, environ: dict[str, str], expected: Path
) -> None:
    assert default_state_dir(environ, is_root=is_root) == expected


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"servers": None}, "--server wss://HOST:PORT is required (or LLMGW_AGENT_SERVERS"),
        ({"servers": ("ws://127.0.0.5:8443",)}, "the agent channel always uses TLS"),
        ({"servers": ("wss://:8443",)}, "no host"),
        ({"servers": ("wss://cp:99999",)}, "--server 'wss://cp:99999'"),
        ({"node_id": "gpu 7"}, "--node-id: invalid node id 'gpu 7'"),
        ({"node_id": None}, "--node-id NODE_ID is required"),
        ({"cert": Path("/nonexistent/node.crt")}, "--cert /nonexistent/node.crt: no such file"),
        ({"port_range": "20999-20000"}, "the first no greater than the last"),
        ({"port_range": "0-10"}, "ports must be 1-65535"),
        ({"port_range": "20000"}, "expected LO-HI"),
        ({"fake_gpus": "4xA100"}, "--fake-gpus: fake GPU spec '4xA100'"),
        ({"log_level": "loud"}, "--log-level 'loud': expected one of debug, info"),
        ({"address": "my host"}, "--address 'my host'"),
        ({"reconnect_max_delay": 0.0}, "--reconnect-max-delay 0.0: expected a positive number"),
        ({"connect_timeout": -1.0}, "--connect-timeout -1.0: expected a positive number"),
        ({"open_timeout": 0.0}, "--open-timeout 0.0: expected a positive number"),
        ({"next_server_after": -5.0}, "--next-server-after -5.0: expected a positive number"),
        (
            {"reconnect_max_delay": float("inf")},
            "--reconnect-max-delay inf: expected a positive number",
        ),
        ({"open_timeout": float("inf")}, "--open-timeout inf: expected a positive number"),
        ({"liveness_interval": -1.0}, "--liveness-interval -1.0: expected a number of seconds"),
        ({"liveness_interval": float("nan")}, "--liveness-interval nan: expected"),
        ({"liveness_failures": 0}, "--liveness-failures 0: expected at least 1"),
    ],
)
def test_a_bad_setting_is_refused_with_a_message_naming_it(
    node_files: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files, **overrides), {})
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PORT_RANGE", "30-20", "LLMGW_AGENT_PORT_RANGE '30-20': ports must be 1-65535"),
        ("ENGINES_ON_EXIT", "maybe", "LLMGW_AGENT_ENGINES_ON_EXIT 'maybe': expected keep or stop"),
        ("LOG_LEVEL", "loud", "LLMGW_AGENT_LOG_LEVEL 'loud': expected one of debug, info"),
        ("FAKE_GPUS", "8xH100", "LLMGW_AGENT_FAKE_GPUS: fake GPU spec '8xH100': expected"),
        ("OPEN_TIMEOUT", "-1", "LLMGW_AGENT_OPEN_TIMEOUT -1.0: expected a positive number"),
        ("LIVENESS_FAILURES", "0", "LLMGW_AGENT_LIVENESS_FAILURES 0: expected at least 1"),
        (
            "SERVERS",
            "wss://127.0.0.5:8443,https://127.0.0.6:8443",
            "LLMGW_AGENT_SERVERS 'https://127.0.0.6:8443': expected wss://HOST:PORT",
        ),
        ("NODE_ID", "gpu 07", "LLMGW_AGENT_NODE_ID: invalid node id 'gpu 07'"),
    ],
)
def test_a_bad_setting_from_the_environment_is_refused_naming_the_variable(
    node_files: Path, variable: str, value: str, message: str
) -> None:
    """Not the flag: the operator set no flag, and would look for one in vain."""
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {f"LLMGW_AGENT_{variable}": value})

    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda path: path.mkdir(), "a directory"),
        (lambda path: os.mkfifo(path), "a named pipe (FIFO)"),
    ],
    ids=["directory", "fifo"],
)
def test_a_certificate_path_that_is_no_file_is_refused_as_what_it_is(
    node_files: Path, make: Callable[[Path], None], kind: str
) -> None:
    # Before, each was "--cert PATH: no such file", of a path that exists.
    odd = node_files / "odd.crt"
    make(odd)

    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files, cert=odd), {})
    with pytest.raises(ConfigError) as device:
        load_config(flags(node_files, ca=Path("/dev/zero")), {})

    assert str(refused.value) == f"--cert {odd}: not a regular file but {kind}"
    assert str(device.value) == "--ca /dev/zero: not a regular file but a character device"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('port_range = "30-20"\n', "port_range '30-20': ports must be 1-65535"),
        ("port_range = [30, 20]\n", "port_range '30-20': ports must be 1-65535"),
        ('engines_on_exit = "maybe"\n', "engines_on_exit 'maybe': expected keep or stop"),
        ('log_level = "loud"\n', "log_level 'loud': expected one of debug, info"),
        ('fake_gpus = "8xH100"\n', "fake_gpus: fake GPU spec '8xH100': expected"),
        ("reconnect_max_delay = 0\n", "reconnect_max_delay 0.0: expected a positive number"),
        ("liveness_interval = -1\n", "liveness_interval -1.0: expected a number of seconds"),
        (
            'servers = ["https://127.0.0.6:8443"]\n',
            "servers 'https://127.0.0.6:8443': expected wss://HOST:PORT",
        ),
        ('node_id = "gpu 07"\n', "node_id: invalid node id 'gpu 07'"),
    ],
)
def test_a_bad_setting_from_the_config_file_is_refused_naming_the_file_and_key(
    node_files: Path, text: str, message: str
) -> None:
    config_file = write_config(node_files, text)

    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)

    assert str(refused.value).startswith(f"config file {config_file}: {message}")


def test_a_missing_certificate_file_is_refused_naming_where_it_was_given(
    node_files: Path,
) -> None:
    """``LLMGW_AGENT_CERT`` pointing nowhere is no ``--cert`` the operator typed, and the
    file's ``key`` is refused though a flag gives another."""
    missing = node_files / "gone.crt"
    with pytest.raises(ConfigError) as from_env:
        load_config(flags(node_files, cert=None), {"LLMGW_AGENT_CERT": str(missing)})
    config_file = write_config(node_files, 'key = "gone.key"\n')
    with pytest.raises(ConfigError) as from_file:
        load_config(flags(node_files), {}, config_file)

    assert str(from_env.value) == f"LLMGW_AGENT_CERT {missing}: no such file"
    assert str(from_file.value) == (
        f"config file {config_file}: key {node_files / 'gone.key'}: no such file"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('node_id = "a"\nsevrers = ["wss://cp:1"]\n', "unknown field `sevrers`"),
        ("node_id = 7\n", "Expected `str`, got `int` - at `$.node_id`"),
        ("node_id = \n", "is not valid TOML"),
    ],
)
def test_a_bad_config_file_is_refused_with_its_name_and_the_problem(
    node_files: Path, text: str, message: str
) -> None:
    config_file = write_config(node_files, text)
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)
    assert str(config_file) in str(refused.value)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("nodeid", "node_id"),
        ("node-id", "node_id"),
        ("sevrers", "servers"),
        ("engine_on_exit", "engines_on_exit"),
    ],
)
def test_a_misspelt_config_key_is_refused_naming_the_key_it_is_closest_to(
    node_files: Path, key: str, meant: str
) -> None:
    config_file = write_config(node_files, f'{key} = "x"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)
    assert str(refused.value) == (
        f"config file {config_file}: unknown field `{key}`: did you mean `{meant}`? "
        "(the keys are in docs/agent.md, Settings)"
    )


def test_a_config_key_like_no_setting_is_refused_pointing_at_the_list_of_keys(
    node_files: Path,
) -> None:
    config_file = write_config(node_files, '[agent]\nnode_id = "gpu-07"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)
    assert str(refused.value) == (
        f"config file {config_file}: unknown field `agent` "
        "(the keys are in docs/agent.md, Settings)"
    )


def test_a_config_file_that_is_not_utf8_is_refused_naming_the_byte(node_files: Path) -> None:
    config_file = node_files / "agent.toml"
    config_file.write_bytes(b'node_id = "gpu-\xff"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)
    assert str(refused.value) == (
        f"config file {config_file} is refused: not UTF-8 text (byte 0xff at offset 15)"
    )


def test_a_config_file_over_64_kib_is_refused_by_its_size(node_files: Path) -> None:
    config_file = write_config(node_files, "# padding\n" * 7000)
    with pytest.raises(ConfigError, match=r"is refused: 70,000 bytes, over the 64 KiB it may"):
        load_config(flags(node_files), {}, config_file)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda path: os.mkfifo(path), "a named pipe (FIFO)"),
        (lambda path: path.mkdir(), "a directory"),
    ],
)
def test_a_config_path_that_is_not_a_regular_file_is_refused_without_waiting(
    node_files: Path, make: Callable[[Path], None], kind: str
) -> None:
    config_file = node_files / "agent.toml"
    make(config_file)
    with pytest.raises(ConfigError, match=f"is refused: not a regular file but {re.escape(kind)}"):
        load_config(flags(node_files), {}, config_file)


def test_a_device_as_config_file_is_refused_rather_than_read_for_ever(node_files: Path) -> None:
    with pytest.raises(ConfigError, match="/dev/zero is refused: not a regular file but a char"):
        load_config(flags(node_files), {}, Path("/dev/zero"))


def test_a_missing_config_file_is_refused(node_files: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the config file /nonexistent\.toml"):
        load_config(flags(node_files), {}, Path("/nonexistent.toml"))


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"LLMGW_AGENT_LABELS": "zone"}, "LLMGW_AGENT_LABELS 'zone': expected key=value"),
        ({"LLMGW_AGENT_LABELS": "a=1,a=2"}, "label 'a' is given twice"),
    ],
)
def test_bad_labels_are_refused(node_files: Path, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(flags(node_files), environ)


# -- the command line --------------------------------------------------------------------


def test_a_usage_error_exits_2_with_the_reason_on_stderr(
    node_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = app(
        ["--server", "ws://127.0.0.5:8443", "--node-id", "gpu-07"],
        result_action="return_value",
    )

    assert code == EXIT_USAGE
    assert "llmgw-agent: --server 'ws://127.0.0.5:8443'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["mark", "--reason", "XID 79"], ["clear"]])
def test_a_fake_gpu_is_not_marked_in_a_state_directory_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A mistyped --state-dir is one no agent reads: it is refused, and not created."""
    typo = tmp_path / "agents" / "dev-node-9"
    verb, *rest = command
    argv = ["fake-gpu", verb, "--state-dir", str(typo), "--gpu", "1", *rest]

    assert app(argv, result_action="return_value") == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"llmgw-agent fake-gpu {verb}: "
        f"--state-dir {typo}: no such directory; give the state directory "
        "of the agent that runs the fake GPUs\n"
    )
    assert not (tmp_path / "agents").exists()


@pytest.mark.parametrize("verb", ["mark", "clear"])
@pytest.mark.parametrize("index", ["1.5", "2.7", "0x10", "1_0", "\u0663", "abc", ""])
def test_a_gpu_index_that_is_not_a_whole_number_is_refused_naming_the_flag_and_marks_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, index: str
) -> None:
    """cyclopts' own int took 1.5 for GPU 2, 0x10 for GPU 16 and an Arabic-Indic three for
    GPU 3, and marked that GPU."""
    (tmp_path / "fake-gpus.json").write_text('{"count": 64}')
    rest = ["--reason", "XID 79"] if verb == "mark" else []
    argv = ["fake-gpu", verb, "--state-dir", str(tmp_path), "--gpu", index, *rest]

    with pytest.raises(SystemExit) as ended:
        app(argv)

    assert ended.value.code == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"llmgw-agent fake-gpu {verb}: --gpu {index!r}: expected a GPU index, a whole number "
        "such as 3\n"
    )
    assert not (tmp_path / "fake-gpu-health.json").exists()


def test_a_file_given_as_the_state_directory_is_told_as_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "agent.toml"
    a_file.write_text("")
    argv = ["fake-gpu", "mark", "--state-dir", str(a_file), "--gpu", "1", "--reason", "XID 79"]

    assert app(argv, result_action="return_value") == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"llmgw-agent fake-gpu mark: --state-dir {a_file}: not a directory; give the state "
        "directory of the agent that runs the fake GPUs\n"
    )


def test_fake_gpus_are_marked_unhealthy_and_cleared_in_the_state_directory(
    tmp_path: Path,
) -> None:
    mark = ["fake-gpu", "mark", "--state-dir", str(tmp_path), "--gpu", "2"]
    health_file = tmp_path / "fake-gpu-health.json"

    assert app([*mark, "--reason", "XID 79"], result_action="return_value") == EXIT_OK
    assert read_health_file(health_file).overrides == {2: "XID 79"}

    clear = ["fake-gpu", "clear", "--state-dir", str(tmp_path), "--gpu", "2"]
    assert app(clear, result_action="return_value") == EXIT_OK
    assert read_health_file(health_file).overrides == {}


@pytest.mark.parametrize(
    "argv",
    [
        ["fake-gpu", "mark", "--state-dir", "", "--gpu", "0", "--reason", "XID 79"],
        ["fake-gpu", "clear", "--state-dir", " ", "--gpu", "0"],
        ["stop-engines", "--state-dir", ""],
        ["--server", "wss://127.0.0.5:8443", "--node-id", "gpu-07", "--state-dir", ""],
        ["--server", "wss://127.0.0.5:8443", "--node-id", "gpu-07", "--cert", ""],
        ["--server", "wss://127.0.0.5:8443", "--node-id", "gpu-07", "--config", ""],
    ],
)
def test_a_path_flag_given_empty_is_bad_usage_not_the_current_directory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        app(argv)

    assert ended.value.code == EXIT_USAGE
    assert "cannot be empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key", ["cert", "key", "ca", "state_dir"])
def test_a_path_given_empty_in_the_config_file_is_refused_not_taken_for_its_folder(
    node_files: Path, key: str
) -> None:
    config_file = write_config(node_files, f'{key} = ""\n')
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)
    assert str(refused.value) == (
        f"config file {config_file}: {key} is empty: give a path, or leave it out"
    )


def test_an_empty_config_variable_is_refused_saying_so(node_files: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {"LLMGW_AGENT_CONFIG": ""})
    assert str(refused.value) == "LLMGW_AGENT_CONFIG is empty: give the config file, or unset it"


AGENT_VARIABLES = [
    "LLMGW_AGENT_SERVERS",
    "LLMGW_AGENT_NODE_ID",
    "LLMGW_AGENT_CERT",
    "LLMGW_AGENT_KEY",
    "LLMGW_AGENT_CA",
    "LLMGW_AGENT_FAKE_GPUS",
    "LLMGW_AGENT_STATE_DIR",
    "LLMGW_AGENT_LABELS",
    "LLMGW_AGENT_ADDRESS",
    "LLMGW_AGENT_PORT_RANGE",
    "LLMGW_AGENT_LOG_LEVEL",
    "LLMGW_AGENT_RECONNECT_MAX_DELAY",
    "LLMGW_AGENT_CONNECT_TIMEOUT",
    "LLMGW_AGENT_OPEN_TIMEOUT",
    "LLMGW_AGENT_NEXT_SERVER_AFTER",
    "LLMGW_AGENT_ENGINES_ON_EXIT",
    "LLMGW_AGENT_LIVENESS_INTERVAL",
    "LLMGW_AGENT_LIVENESS_FAILURES",
]
"""Every variable docs/agent.md's settings table names, but ``LLMGW_AGENT_CONFIG``."""


@pytest.mark.parametrize("empty", ["", "  "])
@pytest.mark.parametrize("variable", AGENT_VARIABLES)
def test_a_variable_set_empty_is_refused_naming_it_even_where_a_flag_sets_the_same(
    node_files: Path, variable: str, empty: str
) -> None:
    """A manifest that left a value blank (``LLMGW_AGENT_NODE_ID=``) was taken for one that
    never set it: the agent ran with the flag's, the file's or the default value, NVML for
    fake GPUs, or said the node id was required when it had been set."""
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {variable: empty})

    assert str(refused.value) == f"{variable} is empty: give a value, or unset it"


def test_the_variables_table_of_the_docs_lists_the_same_variables() -> None:
    page = (Path(__file__).parents[2] / "docs" / "agent.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `--")]
    named = {name for row in rows for name in re.findall(r"`(LLMGW_AGENT_[A-Z_]+)`", row)}

    assert named - {"LLMGW_AGENT_CONFIG"} == set(AGENT_VARIABLES)


def test_a_server_setting_of_the_same_prefix_set_empty_is_not_the_agents(
    node_files: Path,
) -> None:
    """``LLMGW_AGENT_HOST`` is where ``llmgw-server`` listens for agents: not an agent's."""
    config = load_config(flags(node_files), {"LLMGW_AGENT_HOST": "", "LLMGW_AGENT_PORT": ""})

    assert config.node_id == "gpu-07"


@pytest.mark.parametrize(
    ("command", "rest"),
    [("stop-engines", []), ("fake-gpu mark", ["--gpu", "0", "--reason", "XID 79"])],
)
def test_a_command_that_reads_the_state_directory_variable_refuses_it_empty(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    rest: list[str],
) -> None:
    """Empty, it stood for the default state directory: /var/lib/llmgw-agent for root."""
    monkeypatch.setenv("LLMGW_AGENT_STATE_DIR", "")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))

    assert app([*command.split(), *rest], result_action="return_value") == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"llmgw-agent {command}: LLMGW_AGENT_STATE_DIR is empty: give a value, or unset it\n"
    )


# -- what a hello can carry --------------------------------------------------------------


def test_more_fake_gpus_than_a_node_may_report_is_refused_at_start_in_one_line(
    node_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control plane refuses a hello of more than 64 GPUs: an agent started with more
    would reconnect for ever."""
    monkeypatch.chdir(node_files)
    config_file = write_config(
        node_files,
        'servers = ["wss://127.0.0.5:8443"]\nnode_id = "gpu-07"\ncert = "node.crt"\n'
        'key = "node.key"\nca = "ca.crt"\nfake_gpus = "100x80GB"\n',
    )

    code = app(["--config", str(config_file)], result_action="return_value")

    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"llmgw-agent: config file {config_file}: fake_gpus: fake GPU spec '100x80GB': 100 "
        "GPUs; a node may report at most 64 (the control plane refuses a hello with more)\n"
    )


LONG_VALUE = "v" * 257


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[labels]\n" + "".join(f"k{n} = 'v'\n" for n in range(65)),
            "{file}: labels: 65 labels; a node may have at most 64",
        ),
        (
            f"[labels]\nzone = '{LONG_VALUE}'\n",
            "{file}: labels zone: the value has 257 characters; a label's value has at most 256",
        ),
        (
            f"[labels]\n{'k' * 64} = 'v'\n",
            f"{{file}}: labels {'k' * 64!r}: a key is 1-63 letters, digits, '.', '_', '/' or "
            "'-', starting with a letter or digit",
        ),
        (
            "labels = { '' = 'v' }\n",
            "{file}: labels '': a key is 1-63 letters, digits, '.', '_', '/' or '-', starting "
            "with a letter or digit",
        ),
        (
            f"address = '{'a' * 254}'\n",
            f"{{file}}: address {'a' * 40!r}...: 254 characters; a hello carries at most 253, "
            "as a host name has",
        ),
    ],
)
def test_settings_a_hello_cannot_carry_are_refused_at_start(
    node_files: Path, text: str, message: str
) -> None:
    """A hello beyond the wire's bounds is malformed: refused at every connection, the
    error naming where the setting was given (a label from the file is no `--label`)."""
    config_file = write_config(node_files, text)

    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {}, config_file)

    assert str(refused.value) == message.replace("{file}", f"config file {config_file}")


def test_labels_a_hello_cannot_carry_are_refused_naming_the_environment_variable(
    node_files: Path,
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {"LLMGW_AGENT_LABELS": f"zone={LONG_VALUE}"})

    assert str(refused.value) == (
        "LLMGW_AGENT_LABELS zone: the value has 257 characters; a label's value has at most 256"
    )


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("my host", "LLMGW_AGENT_ADDRESS 'my host': expected a host name or IP address"),
        (
            "a" * 254,
            f"LLMGW_AGENT_ADDRESS {'a' * 40!r}...: 254 characters; a hello carries at most 253, "
            "as a host name has",
        ),
    ],
)
def test_an_address_a_hello_cannot_carry_is_refused_naming_the_environment_variable(
    node_files: Path, address: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(flags(node_files), {"LLMGW_AGENT_ADDRESS": address})

    assert str(refused.value) == message


def test_a_label_value_over_256_characters_is_refused_from_the_command_line_too(
    node_files: Path,
) -> None:
    with pytest.raises(ConfigError, match="--label zone: the value has 257 characters"):
        load_config(flags(node_files, labels={"zone": LONG_VALUE}), {})


@pytest.mark.parametrize("value", ["a\x1b]0;x\x07", "rack\n7", "\x00"])
def test_a_label_value_holding_a_control_character_is_refused(node_files: Path, value: str) -> None:
    """The hub refuses a hello whose label holds one: the agent says so at start instead of
    being refused at every connection."""
    with pytest.raises(ConfigError, match=r"--label zone: the value .* holds a control character"):
        load_config(flags(node_files, labels={"zone": value}), {})


def test_the_most_labels_a_hello_carries_are_taken(node_files: Path) -> None:
    labels = {f"{'k' * 60}{n:03}": "v" * 256 for n in range(64)}

    assert load_config(flags(node_files, labels=labels), {}).labels == labels
