"""Where llmgw-cli finds the operator certificate: flags, then environment (the current
names, then the former ones), then the config file; an admin URL no connection could
follow, or one given empty, is a usage error."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from cli.config import (
    DEFAULT_ADMIN_URL,
    FORMER_SETTING_ENV,
    ConfigError,
    ConnectionFlags,
    resolve_settings,
)
from cli.keys import list_keys
from cli.main import app
from tests.support.waiting import open_fifo_writer_briefly, outcome_within


def environment(tmp_path: Path, **settings: str) -> dict[str, str]:
    return {"LLMGW_CONFIG": str(tmp_path / "cli.toml"), **settings}


def test_the_admin_certificate_comes_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "cli.toml").write_text("")
    settings = resolve_settings(
        ConnectionFlags(),
        environment(
            tmp_path,
            # http: the files are only checked where they are used (https, below).
            LLMGW_ADMIN_URL="http://llmgw.internal:8081",
            LLMGW_ADMIN_CERT="/etc/llmgw/operator-alice.crt",
            LLMGW_ADMIN_KEY="/etc/llmgw/operator-alice.key",
            LLMGW_ADMIN_CA="/etc/llmgw/ca.crt",
        ),
    )

    assert settings.client_cert == Path("/etc/llmgw/operator-alice.crt")
    assert settings.client_key == Path("/etc/llmgw/operator-alice.key")
    assert settings.ca_cert == Path("/etc/llmgw/ca.crt")


def test_the_former_names_are_still_read_after_the_current_ones(tmp_path: Path) -> None:
    (tmp_path / "cli.toml").write_text("")
    settings = resolve_settings(
        ConnectionFlags(),
        environment(
            tmp_path,
            LLMGW_CLIENT_CERT="/old/alice.crt",
            LLMGW_CLIENT_KEY="/old/alice.key",
            LLMGW_CA_CERT="/old/ca.crt",
            LLMGW_ADMIN_CA="/new/ca.crt",
        ),
    )

    assert (settings.client_cert, settings.client_key, settings.ca_cert) == (
        Path("/old/alice.crt"),
        Path("/old/alice.key"),
        Path("/new/ca.crt"),
    )


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    (tmp_path / "cli.toml").write_text(
        'client_cert = "file.crt"\nclient_key = "file.key"\nca_cert = "ca.crt"\n'
    )
    settings = resolve_settings(
        ConnectionFlags(client_cert="/flag/alice.crt"),
        environment(tmp_path, LLMGW_ADMIN_CERT="/env/alice.crt", LLMGW_ADMIN_KEY="/env/a.key"),
    )

    assert settings.client_cert == Path("/flag/alice.crt")
    assert settings.client_key == Path("/env/a.key")
    assert settings.ca_cert == tmp_path / "ca.crt"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:notaport", "http://llmgw.internal:99999", "https://:8081"]
)
def test_an_admin_url_without_a_usable_host_and_port_is_a_usage_error(
    tmp_path: Path, url: str
) -> None:
    (tmp_path / "cli.toml").write_text("")
    with pytest.raises(ConfigError, match="host and port"):
        resolve_settings(ConnectionFlags(admin_url=url), environment(tmp_path))


@pytest.mark.parametrize("url", ["http://", "https://", "http:///", "https:////"])
def test_an_admin_url_of_a_scheme_alone_is_refused_for_its_missing_host_quoted_as_given(
    tmp_path: Path, url: str
) -> None:
    (tmp_path / "cli.toml").write_text("")
    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(admin_url=url), environment(tmp_path))

    assert str(refused.value) == (
        "the admin API URL needs a host and port like https://llmgw.internal:8081, not "
        f"{url!r} (from --admin-url)"
    )


@pytest.mark.parametrize(
    ("variable", "refusal"),
    [
        ("LLMGW_ADMIN_CA", "the llmgw CA certificate {path} (from $LLMGW_ADMIN_CA) {problem}"),
        ("LLMGW_ADMIN_CERT", "the operator certificate {path} (from $LLMGW_ADMIN_CERT) {problem}"),
        (
            "LLMGW_CLIENT_KEY",
            "the operator certificate's key {path} (from $LLMGW_CLIENT_KEY) {problem}",
        ),
    ],
)
@pytest.mark.parametrize(
    ("standing", "problem"),
    [
        ("missing", "does not exist"),
        ("a-directory", "is not a regular file but a directory"),
        ("a-fifo", "is not a regular file but a named pipe (FIFO)"),
        ("a-device", "is not a regular file but a character device"),
    ],
)
def test_a_certificate_or_key_that_is_no_readable_file_is_a_usage_error_naming_it(
    tmp_path: Path, variable: str, refusal: str, standing: str, problem: str
) -> None:
    # Before, the command went on to fail when TLS was set up (exit 1, "cannot load the
    # CA certificate"), where llmgw-server and llmgw-agent take a missing certificate for
    # bad usage (exit 2), as a mistyped path is. What stands there is named, as the
    # server's and the agent's readers name it, not only "is not a file".
    (tmp_path / "cli.toml").write_text("")
    path = {
        "missing": tmp_path / "missing.pem",
        "a-directory": tmp_path,
        "a-fifo": tmp_path / "fifo.pem",
        "a-device": Path("/dev/null"),
    }[standing]
    if standing == "a-fifo":
        os.mkfifo(path)
    settings = environment(
        tmp_path, LLMGW_ADMIN_URL="https://llmgw.internal:8081", **{variable: str(path)}
    )

    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(), settings)

    assert str(refused.value) == refusal.format(path=path, problem=problem)


def test_a_certificate_over_512_kib_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    # Before, it was taken, and TLS set-up refused it later as a failure (exit 1).
    (tmp_path / "cli.toml").write_text("")
    huge = tmp_path / "ca.crt"
    huge.write_bytes(b"#" * (512 * 1024 + 1))
    settings = environment(
        tmp_path, LLMGW_ADMIN_URL="https://llmgw.internal:8081", LLMGW_ADMIN_CA=str(huge)
    )

    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(), settings)

    assert str(refused.value) == (
        f"the llmgw CA certificate {huge} (from $LLMGW_ADMIN_CA) is 524,289 bytes, over the "
        "512 KiB it may hold"
    )


def test_a_missing_ca_certificate_exits_2_with_one_line_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    monkeypatch.setenv("LLMGW_ADMIN_CA", str(tmp_path / "ca.crt"))

    code = list_keys(connection=ConnectionFlags(admin_url="https://127.0.0.1:9"))

    assert code == 2
    assert capsys.readouterr().err == (
        f"llmgw-cli keys list: the llmgw CA certificate {tmp_path / 'ca.crt'} (from "
        "$LLMGW_ADMIN_CA) does not exist\n"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://bob:s3cret-pw@127.0.0.1:8081", "http://***@127.0.0.1:8081"),
        ("https://s3cret-pw@llmgw.internal:8081/", "https://***@llmgw.internal:8081/"),
        ("http://bob:s3cret-pw@", "http://***@"),
        ("ftp://bob:s3cret-pw@llmgw.internal", "ftp://***@llmgw.internal"),
    ],
)
def test_an_admin_url_with_a_user_or_password_is_refused_without_repeating_them(
    tmp_path: Path, url: str, shown: str
) -> None:
    # Before, such a URL was taken as it was: the admin API never reads a password (it
    # takes a token), and every message naming the URL (server unreachable, too slow,
    # not the admin API) wrote the password out on stderr, into CI logs and journals.
    (tmp_path / "cli.toml").write_text("")
    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(admin_url=url), environment(tmp_path))

    assert "s3cret" not in str(refused.value)
    assert repr(shown) in str(refused.value)


def test_an_admin_url_with_a_password_exits_2_naming_the_variable_not_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    monkeypatch.setenv("LLMGW_ADMIN_URL", "http://bob:s3cret-pw@127.0.0.1:8081")

    code = list_keys()

    assert code == 2
    assert capsys.readouterr().err == (
        "llmgw-cli keys list: the admin API URL must not hold a user or password "
        "('http://***@127.0.0.1:8081', from $LLMGW_ADMIN_URL): give the token in "
        "$LLMGW_ADMIN_TOKEN (or --token, or token in the config file) and the URL as "
        "https://HOST:PORT\n"
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8081?token=abc",
        "http://127.0.0.1:8081/?x=1",
        "https://llmgw.internal:8081#admin",
        "https://llmgw.internal:8081?",
    ],
)
def test_an_admin_url_with_a_query_or_fragment_is_a_usage_error(tmp_path: Path, url: str) -> None:
    # Before, every request's path went after the query ("no such path: /" from the
    # server, exit 1), as if the admin API were missing.
    (tmp_path / "cli.toml").write_text("")
    with pytest.raises(ConfigError, match="cannot have a query or fragment"):
        resolve_settings(ConnectionFlags(admin_url=url), environment(tmp_path))


def test_an_admin_url_with_a_path_prefix_is_kept(tmp_path: Path) -> None:
    (tmp_path / "cli.toml").write_text("")
    settings = resolve_settings(
        ConnectionFlags(admin_url="https://proxy.internal:443/llmgw/"), environment(tmp_path)
    )

    assert settings.admin_url == "https://proxy.internal:443/llmgw"


@pytest.mark.parametrize("empty", ["", "  "])
@pytest.mark.parametrize(
    ("flag", "env", "in_file", "said"),
    [
        (True, None, None, "--admin-url is empty: give the admin API URL, like "
         "https://llmgw.internal:8081, or leave the flag out"),
        (False, True, None, "$LLMGW_ADMIN_URL is empty: give the admin API URL, like "
         "https://llmgw.internal:8081, or unset it"),
        (False, None, True, "admin_url in {file} is empty: give the admin API URL, like "
         "https://llmgw.internal:8081, or leave it out of the file"),
    ],
)  # fmt: skip
def test_an_admin_url_given_empty_is_refused_naming_where_not_taken_for_the_default(
    tmp_path: Path, empty: str, flag: bool, env: bool | None, in_file: bool | None, said: str
) -> None:
    config = tmp_path / "cli.toml"
    config.write_text(f'admin_url = "{empty}"\n' if in_file else "")
    settings = environment(tmp_path, **({"LLMGW_ADMIN_URL": empty} if env else {}))

    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(admin_url=empty if flag else None), settings)

    assert str(refused.value) == said.format(file=config)


def test_an_empty_admin_url_flag_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")

    code = list_keys(connection=ConnectionFlags(admin_url=""))

    assert code == 2
    assert capsys.readouterr().err == (
        "llmgw-cli keys list: --admin-url is empty: give the admin API URL, like "
        "https://llmgw.internal:8081, or leave the flag out\n"
    )


def test_an_unset_admin_url_is_the_default_and_a_flag_beats_an_empty_variable(
    tmp_path: Path,
) -> None:
    (tmp_path / "cli.toml").write_text("")

    unset = resolve_settings(ConnectionFlags(), environment(tmp_path))
    flag = resolve_settings(
        ConnectionFlags(admin_url="https://llmgw.internal:8081"),
        environment(tmp_path, LLMGW_ADMIN_URL=""),
    )

    assert unset.admin_url == DEFAULT_ADMIN_URL
    assert flag.admin_url == "https://llmgw.internal:8081"


CREDENTIALS = [
    ("token", "--token", "LLMGW_ADMIN_TOKEN", "the admin token"),
    ("client_cert", "--client-cert", "LLMGW_ADMIN_CERT", "the operator certificate's path"),
    ("client_key", "--client-key", "LLMGW_ADMIN_KEY", "its private key's path"),
    ("ca_cert", "--ca-cert", "LLMGW_ADMIN_CA", "the llmgw CA certificate's path"),
]


@pytest.mark.parametrize("empty", ["", "  "])
@pytest.mark.parametrize("where", ["flag", "env", "former env", "file"])
@pytest.mark.parametrize(("name", "flag", "env", "what"), CREDENTIALS)
def test_a_credential_given_empty_is_refused_naming_where_not_taken_for_none(
    tmp_path: Path, empty: str, where: str, name: str, flag: str, env: str, what: str
) -> None:
    former = FORMER_SETTING_ENV.get(name)
    if where == "former env" and former is None:
        pytest.skip(f"{name} never had another name")
    config = tmp_path / "cli.toml"
    config.write_text(f'{name} = "{empty}"\n' if where == "file" else "")
    variables = {"env": {env: empty}, "former env": {str(former): empty}}.get(where, {})
    flags = ConnectionFlags(**{name: empty}) if where == "flag" else ConnectionFlags()

    with pytest.raises(ConfigError) as refused:
        resolve_settings(flags, environment(tmp_path, **variables))

    source, otherwise = {
        "flag": (flag, "leave the flag out"),
        "env": (f"${env}", "unset it"),
        "former env": (f"${former}", "unset it"),
        "file": (f"{name} in {config}", "leave it out of the file"),
    }[where]
    assert str(refused.value) == f"{source} is empty: give {what}, or {otherwise}"


def test_an_empty_token_variable_exits_2_with_one_line_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "")

    code = list_keys(connection=ConnectionFlags(admin_url="http://127.0.0.1:9"))

    assert code == 2
    assert capsys.readouterr().err == (
        "llmgw-cli keys list: $LLMGW_ADMIN_TOKEN is empty: give the admin token, or unset it\n"
    )


def test_unset_credentials_are_none_and_a_flag_beats_an_empty_variable(tmp_path: Path) -> None:
    (tmp_path / "cli.toml").write_text("")

    unset = resolve_settings(ConnectionFlags(), environment(tmp_path))
    flag = resolve_settings(
        ConnectionFlags(token="t0ken", client_cert="/flag/alice.crt"),
        environment(tmp_path, LLMGW_ADMIN_TOKEN="", LLMGW_ADMIN_CERT=""),
    )

    assert (unset.token, unset.client_cert, unset.client_key, unset.ca_cert) == (None,) * 4
    assert (flag.token, flag.client_cert) == ("t0ken", Path("/flag/alice.crt"))


@pytest.mark.parametrize("path", [("nodes",), ("keys", "list"), ("cert", "list"), ("bench",)])
def test_help_names_the_certificate_key_and_ca_flags_paths(path: tuple[str, ...]) -> None:
    # Before, each was shown as --client-cert STR, as if any text would do.
    shown = io.StringIO()
    app.help_print(list(path), console=Console(file=shown, width=200, force_terminal=False))

    for flag in ("--client-cert", "--client-key", "--ca-cert"):
        assert re.search(rf"{flag} +PATH ", shown.getvalue()), flag


def test_an_empty_certificate_path_flag_is_still_refused_as_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")

    with pytest.raises(SystemExit) as ended:
        app(["keys", "list", "--admin-url", "http://127.0.0.1:9", "--client-cert", ""])

    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        "llmgw-cli keys list: --client-cert is empty: give the operator certificate's path, "
        "or leave the flag out\n"
    )


@pytest.mark.timeout(10)
def test_a_config_file_without_end_is_refused_after_64_kib() -> None:
    # Before, $LLMGW_CONFIG=/dev/zero was read until memory ran out.
    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(), {"LLMGW_CONFIG": "/dev/zero"})

    assert (
        str(refused.value) == "config file /dev/zero is over 64 KiB: a config file is a few lines"
    )


def test_a_config_fifo_no_program_writes_to_is_refused_at_once(tmp_path: Path) -> None:
    # Before, llmgw-cli waited in the open of the FIFO for a writer for ever.
    fifo = tmp_path / "cli.toml"
    os.mkfifo(fifo)

    refused = outcome_within(
        lambda: resolve_settings(ConnectionFlags(), environment(tmp_path)),
        unblock=lambda: open_fifo_writer_briefly(fifo),
        what="reading a FIFO named by $LLMGW_CONFIG",
    )

    assert isinstance(refused, ConfigError)
    assert str(refused) == (
        f"cannot read config file {fifo} (from $LLMGW_CONFIG): a named pipe (FIFO) that no "
        "program writes to: give a file, or a pipe a command writes to such as <(command)"
    )


def test_a_config_given_as_a_pipe_a_command_writes_to_is_read(tmp_path: Path) -> None:
    # What <(command) hands over: a pipe, which the writer may have closed already.
    read_end, write_end = os.pipe()
    os.write(write_end, b'admin_url = "http://llmgw.internal:8081"\n')
    os.close(write_end)
    try:
        settings = resolve_settings(ConnectionFlags(), {"LLMGW_CONFIG": f"/dev/fd/{read_end}"})
    finally:
        os.close(read_end)

    assert settings.admin_url == "http://llmgw.internal:8081"


def test_a_config_file_over_64_kib_is_refused_and_one_of_64_kib_read(tmp_path: Path) -> None:
    config = tmp_path / "cli.toml"
    setting = b'admin_url = "http://llmgw.internal:8081"\n'
    config.write_bytes(setting + b"#" * (64 * 1024 - len(setting)))

    assert resolve_settings(ConnectionFlags(), environment(tmp_path)).admin_url == (
        "http://llmgw.internal:8081"
    )
    config.write_bytes(config.read_bytes() + b"#")
    with pytest.raises(ConfigError, match="is over 64 KiB"):
        resolve_settings(ConnectionFlags(), environment(tmp_path))


def test_a_config_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    # Before, llmgw-cli ended in a UnicodeDecodeError traceback.
    config = tmp_path / "cli.toml"
    config.write_bytes(b'token = "\xff"\n')

    with pytest.raises(ConfigError) as refused:
        resolve_settings(ConnectionFlags(), environment(tmp_path))

    assert str(refused.value).startswith(f"config file {config} is not UTF-8 text: ")


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o640, True), (0o600, False)])
def test_a_token_read_from_a_config_file_others_can_read_is_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: int, warned: bool
) -> None:
    config = tmp_path / "cli.toml"
    config.write_text('token = "0123456789abcdef0123"\n')
    config.chmod(mode)

    settings = resolve_settings(ConnectionFlags(), environment(tmp_path))

    assert settings.token == "0123456789abcdef0123"
    said = capsys.readouterr().err
    expected = (
        f"warning: {config} holds the admin token and other users can read it "
        f"(mode {mode:04o}): chmod 600 {config}, or give the token in $LLMGW_ADMIN_TOKEN\n"
    )
    assert said == (expected if warned else "")
    assert "0123456789abcdef0123" not in said


def test_a_config_file_others_can_read_is_not_warned_of_when_the_token_comes_from_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cli.toml"
    config.write_text('token = "0123456789abcdef0123"\n')
    config.chmod(0o644)

    resolve_settings(ConnectionFlags(), environment(tmp_path, LLMGW_ADMIN_TOKEN="x" * 20))

    assert capsys.readouterr().err == ""
