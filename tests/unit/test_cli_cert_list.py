"""`llmgw-cli cert list` without a config file asks the admin API at its defaults, and
lists the CA directory alone if nobody answers; a config file that is there but unusable
is bad usage (exit 2) naming the file and what is wrong, and nothing is listed; an admin
API that answers but refuses the credentials fails it (exit 1), as any command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli.cert_revocation import list_certificates
from cli.config import FORMER_SETTING_ENV, SETTING_ENV, ConnectionFlags
from tests.support.ports import free_port
from tests.support.stub_admin import StubHandler, stub_admin_api


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the config file is looked for; nothing there yet, and nobody listening at the
    admin URL."""
    for name in ("LLMGW_CONFIG", *SETTING_ENV.values(), *FORMER_SETTING_ENV.values()):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("LLMGW_ADMIN_URL", f"http://127.0.0.1:{free_port()}")
    directory = tmp_path / "config" / "llmgw"
    directory.mkdir(parents=True)
    return directory


def test_without_a_config_file_the_ca_directory_is_listed(
    config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ca").mkdir()

    code = list_certificates(ca_dir=tmp_path / "ca", output="json")

    assert code == 0
    captured = capsys.readouterr()
    assert captured.out == "[]\n"
    assert "the admin API did not answer" in captured.err
    assert captured.err.endswith("; showing the CA directory alone\n")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"admin_url = [", "is not valid TOML"),
        (b'admin_uri = "https://llmgw.internal:8081"\n', "unknown setting(s) admin_uri"),
        (b"token = 7\n", "token must be a string"),
        (None, "cannot read config file"),
    ],
    ids=["not-toml", "unknown-setting", "not-a-string", "a-directory"],
)
def test_a_config_file_that_cannot_be_used_is_bad_usage_and_nothing_is_listed(
    config_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes | None,
    problem: str,
) -> None:
    # Before, any of these was "the admin API is not configured", and the certificates were
    # listed as issued, revocations unknown, with exit 0.
    config = config_home / "cli.toml"
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    (tmp_path / "ca").mkdir()

    code = list_certificates(ca_dir=tmp_path / "ca", output="json")

    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("llmgw-cli cert list: ")
    assert str(config) in captured.err
    assert problem in captured.err
    assert captured.err.endswith(" (--offline lists the CA directory alone)\n")
    assert captured.err.count("\n") == 1


def test_offline_reads_no_config_file(
    config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config_home / "cli.toml").write_bytes(b"admin_url = [")
    (tmp_path / "ca").mkdir()

    assert list_certificates(ca_dir=tmp_path / "ca", offline=True, output="json") == 0
    assert capsys.readouterr() == ("[]\n", "")


ENTRY = (
    '{"serial":"0a","kind":"node","common_name":"gpu-07","not_before":"2026-01-01T00:00:00Z",'
    '"not_after":"2027-01-01T00:00:00Z","certificate_file":"/ca/node-gpu-07.crt"}'
)


def test_damaged_lines_of_the_record_are_skipped_and_counted_and_the_rest_listed(
    config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ca").mkdir()
    naive = ENTRY.replace("00:00Z", "00:00").replace('"0a"', '"0b"')
    (tmp_path / "ca" / "issued.jsonl").write_bytes(
        f"{ENTRY}\n{naive}\n{{not json\n".encode() + b"\xff\xfe\n[1]\n"
    )

    code = list_certificates(ca_dir=tmp_path / "ca", offline=True, output="json")

    captured = capsys.readouterr()
    assert code == 0
    assert [row["serial"] for row in json.loads(captured.out)] == ["0a"]
    assert "4 unreadable line(s)" in captured.err


def test_a_record_that_is_not_a_regular_file_is_refused_unread(
    config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ca").mkdir()
    os.mkfifo(tmp_path / "ca" / "issued.jsonl")

    code = list_certificates(ca_dir=tmp_path / "ca", offline=True, output="json")

    assert code == 1
    assert capsys.readouterr() == (
        "",
        f"llmgw-cli cert list: cannot read {tmp_path / 'ca' / 'issued.jsonl'}: not a regular "
        "file but a named pipe (FIFO)\n",
    )


@pytest.mark.parametrize("dangling", [False, True], ids=["missing", "dangling-symlink"])
def test_a_ca_directory_that_is_not_there_is_bad_usage_naming_the_flag(
    config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dangling: bool
) -> None:
    # Before, a mistyped --dir listed an empty CA with exit 0, while a file there failed.
    directory = tmp_path / "ca"
    if dangling:
        directory.symlink_to(tmp_path / "gone")

    code = list_certificates(ca_dir=directory, offline=True, output="json")

    assert code == 2
    problem = (
        f"a symbolic link to {tmp_path / 'gone'}, which does not exist"
        if dangling
        else "no such directory"
    )
    assert capsys.readouterr() == ("", f"llmgw-cli cert list: --dir {directory}: {problem}\n")


class RefusingTheToken(StubHandler):
    def do_GET(self) -> None:
        self.answer(401, "application/problem+json", b'{"title": "unauthorized"}')


def test_an_admin_api_refusing_the_token_fails_the_listing_as_any_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, a refused token was taken for a server that did not answer: every
    # certificate listed as "issued (revocations unknown)", exit 0, where every other
    # command exits 1 for the same mistake.
    (tmp_path / "ca").mkdir()
    with stub_admin_api(RefusingTheToken, monkeypatch) as url:
        monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "t0ken-s3cret")
        code = list_certificates(
            ca_dir=tmp_path / "ca", output="json", connection=ConnectionFlags(admin_url=url)
        )

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.startswith(
        "llmgw-cli cert list: authentication required: the admin API refused the token given"
    )
    assert captured.err.endswith(" (--offline lists the CA directory alone)\n")
    assert "t0ken-s3cret" not in captured.err
