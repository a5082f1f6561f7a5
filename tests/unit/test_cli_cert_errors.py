"""Each ``llmgw-cli cert`` command tells its errors as every other command does: one line on
stderr naming the command typed (``llmgw-cli cert node: ...``), so a grep for it finds them,
with exit 1 for what failed and 2 for bad usage. ``cert node`` issues by this machine's
clock only where the admin API does not answer; one that refuses the token fails it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import app
from tests.support.stub_admin import StubHandler, stub_admin_api


@pytest.fixture
def ca_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    monkeypatch.delenv("LLMGW_CA_DIR", raising=False)
    with pytest.raises(SystemExit) as ended:
        app(["cert", "init-ca", "--dir", str(tmp_path / "ca")])
    assert ended.value.code == 0
    return tmp_path / "ca"


def ran(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        app(argv)
    out, err = capsys.readouterr()
    return ended.value.code, out, err


def test_each_cert_command_names_itself_in_its_errors(
    ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, every one of them said "llmgw-cli cert: ...", whichever it was.
    again = ran(["cert", "init-ca", "--dir", str(ca_dir)], capsys)
    issued = ran(["cert", "node", "gpu-07", "--dir", str(ca_dir), "--offline"], capsys)
    twice = ran(["cert", "node", "gpu-07", "--dir", str(ca_dir), "--offline"], capsys)
    bad_id = ran(["cert", "node", "gpu 07", "--dir", str(ca_dir), "--offline"], capsys)
    no_ca = ran(["cert", "operator", "alice", "--dir", str(tmp_path / "none")], capsys)
    missing = ran(["cert", "show", str(tmp_path / "missing.crt")], capsys)

    assert again[0] == 1
    assert again[2].startswith("llmgw-cli cert init-ca: refusing to overwrite ")
    assert issued[0] == 0
    assert twice[0] == 1
    assert twice[2].startswith("llmgw-cli cert node: refusing to overwrite ")
    assert bad_id[0] == 2
    assert bad_id[2].startswith("llmgw-cli cert node: invalid node id 'gpu 07'")
    assert no_ca[0] == 1
    assert no_ca[2].startswith("llmgw-cli cert operator: ")
    assert no_ca[2].endswith(f"run `llmgw-cli cert init-ca --dir {tmp_path / 'none'}` first\n")
    assert missing == (1, "", f"llmgw-cli cert show: {tmp_path / 'missing.crt'}: no such file\n")


class RefusingTheToken(StubHandler):
    def do_GET(self) -> None:
        self.answer(401, "application/problem+json", b'{"title": "unauthorized"}')


def test_cert_node_refused_by_the_admin_api_issues_nothing_and_exits_1(
    ca_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, a token the admin API refused was taken for a server that did not answer:
    # the certificate was issued by this machine's clock, exit 0, unlike every other
    # command given that token (and unlike the page: "does not answer").
    with stub_admin_api(RefusingTheToken, monkeypatch) as url:
        monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "t0ken-s3cret")
        code, out, err = ran(
            ["cert", "node", "gpu-07", "--dir", str(ca_dir), "--admin-url", url], capsys
        )

    assert (code, out) == (1, "")
    assert err.startswith(
        "llmgw-cli cert node: authentication required: the admin API refused the token given"
    )
    assert err.endswith("; nothing was issued (--offline issues without asking it)\n")
    assert "t0ken-s3cret" not in err
    assert not (ca_dir / "node-gpu-07.crt").exists()
