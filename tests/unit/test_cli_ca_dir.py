"""$LLMGW_CA_DIR set empty is bad usage naming it, as any llmgw-cli setting given empty is:
taken for unset, a CA (its private key too) would be created, read or listed somewhere the
operator did not name."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import app


@pytest.fixture
def empty_ca_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$LLMGW_CA_DIR empty, the XDG default under ``tmp_path``, which is the working
    directory too."""
    monkeypatch.setenv("LLMGW_CA_DIR", " ")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("LLMGW_CONFIG", "/dev/null")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["cert", "init-ca"], "llmgw-cli cert init-ca"),
        (["cert", "node", "gpu-07"], "llmgw-cli cert node"),
        (["cert", "server", "--host", "cp-1"], "llmgw-cli cert server"),
        (["cert", "operator", "alice"], "llmgw-cli cert operator"),
        (["cert", "list", "--offline"], "llmgw-cli cert list"),
    ],
)
def test_an_empty_llmgw_ca_dir_is_bad_usage_and_nothing_is_written(
    empty_ca_dir_env: Path, capsys: pytest.CaptureFixture[str], argv: list[str], command: str
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(argv)

    assert ended.value.code == 2
    assert capsys.readouterr() == (
        "",
        f"{command}: $LLMGW_CA_DIR is empty: give the CA directory, or unset it\n",
    )
    assert sorted(path.name for path in empty_ca_dir_env.iterdir()) == []


def test_an_empty_xdg_data_home_is_unset_as_the_xdg_specification_says(
    empty_ca_dir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_CA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.setenv("HOME", str(empty_ca_dir_env / "home"))

    with pytest.raises(SystemExit) as ended:
        app(["cert", "init-ca"])

    assert ended.value.code == 0
    assert (empty_ca_dir_env / "home" / ".local" / "share" / "llmgw" / "ca" / "ca.key").exists()
