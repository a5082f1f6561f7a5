"""The Docker fallback of ``llmgw-dev``: one container and volume per state directory,
published on loopback only. A stand-in ``docker`` program on PATH records what is asked of it
and answers as the real one does, so the fallback's control flow runs without a daemon."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devcluster.docker import DockerPostgres, container_name, docker_answers, run_arguments
from devcluster.errors import DevDatabaseError

FAKE_DOCKER = """#!/bin/sh
echo "$@" >> "{calls}"
case "$1" in
  info) exit {info_status} ;;
  container) exit {inspect_status} ;;
  port) echo "127.0.0.1:{port}" ;;
esac
exit 0
"""


def fake_docker(tmp_path: Path, *, info_ok: bool, exists: bool, port: int = 55432) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    script = bindir / "docker"
    script.write_text(
        FAKE_DOCKER.format(
            calls=calls,
            info_status=0 if info_ok else 1,
            inspect_status=0 if exists else 1,
            port=port,
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


def test_each_state_directory_has_its_own_container(tmp_path: Path) -> None:
    first, second = container_name(tmp_path / "a"), container_name(tmp_path / "b")

    assert first != second
    assert first == container_name(tmp_path / "a" / ".." / "a")
    assert first.startswith("llmgw-dev-postgres-")


def test_a_new_container_listens_on_loopback_only_and_keeps_its_data_in_a_volume() -> None:
    arguments = run_arguments("llmgw-dev-postgres-x", 55000)

    assert arguments[arguments.index("--publish") + 1] == "127.0.0.1:55000:5432"
    assert arguments[arguments.index("--volume") + 1].startswith("llmgw-dev-postgres-x:")


def test_a_daemon_that_does_not_answer_is_no_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, info_ok=False, exists=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))

    assert not docker_answers()


def test_no_docker_program_is_no_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    assert not docker_answers()


def test_a_new_state_directory_runs_a_container_and_records_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_docker(tmp_path, info_ok=True, exists=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    postgres = DockerPostgres(tmp_path / "state")

    postgres.start()

    asked = calls.read_text().splitlines()
    assert any(line.startswith("run --detach") for line in asked)
    port = int((tmp_path / "state" / "docker-port").read_text())
    assert postgres.url("llmgw") == f"postgresql://postgres@127.0.0.1:{port}/llmgw"


def test_an_existing_container_is_started_again_on_its_published_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_docker(tmp_path, info_ok=True, exists=True, port=55999)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    postgres = DockerPostgres(tmp_path / "state")

    postgres.start()
    postgres.stop()

    asked = calls.read_text().splitlines()
    assert f"start {postgres.name}" in asked
    assert not any(line.startswith("run ") for line in asked)
    assert postgres.url() == "postgresql://postgres@127.0.0.1:55999/postgres"
    assert f"stop {postgres.name}" in asked


def test_a_url_before_start_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DevDatabaseError, match="not been started"):
        DockerPostgres(tmp_path).url()
