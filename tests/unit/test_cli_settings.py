"""Where llmgw-cli finds the operator certificate: flags, then environment (the current
names, then the former ones), then the config file; an admin URL no connection could
follow is a usage error."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.config import ConfigError, ConnectionFlags, resolve_settings


def environment(tmp_path: Path, **settings: str) -> dict[str, str]:
    return {"LLMGW_CONFIG": str(tmp_path / "cli.toml"), **settings}


def test_the_admin_certificate_comes_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "cli.toml").write_text("")
    settings = resolve_settings(
        ConnectionFlags(),
        environment(
            tmp_path,
            LLMGW_ADMIN_URL="https://llmgw.internal:8081",
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
        ConnectionFlags(client_cert=Path("/flag/alice.crt")),
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
