"""`llmgw-cli cert ...` run as the operator runs it: the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.x509.oid import NameOID

from app.pki.files import load_ca, load_certificate


def console_script() -> str:
    beside_python = Path(sys.executable).parent / "llmgw-cli"
    found = str(beside_python) if beside_python.exists() else shutil.which("llmgw-cli")
    assert found, "llmgw-cli is not installed (pip install -e .)"
    return found


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Operator:
    """Runs llmgw-cli in a scratch home whose default CA directory is under XDG_DATA_HOME."""

    home: Path

    @property
    def default_ca_dir(self) -> Path:
        return self.home / "data" / "llmgw" / "ca"

    def run(self, *args: str) -> Result:
        environment = {key: value for key, value in os.environ.items() if key != "LLMGW_CA_DIR"} | {
            "HOME": str(self.home),
            "XDG_DATA_HOME": str(self.home / "data"),
            "COLUMNS": "200",
        }
        completed = subprocess.run(
            [console_script(), "cert", *args],
            cwd=self.home,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return Result(completed.returncode, completed.stdout, completed.stderr)


@pytest.fixture
def operator(tmp_path: Path) -> Operator:
    return Operator(home=tmp_path)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_ca_creates_a_private_key_and_a_root_in_the_default_directory(
    operator: Operator,
) -> None:
    result = operator.run("init-ca", "--name", "llmgw CA (test)", "--days", "30")

    assert result.code == 0, result.stderr
    ca_dir = operator.default_ca_dir
    assert mode(ca_dir / "ca.key") == 0o600
    assert mode(ca_dir / "ca.crt") == 0o644
    assert load_ca(ca_dir).certificate.subject.rfc4514_string() == "O=llmgw,CN=llmgw CA (test)"
    assert str(ca_dir / "ca.key") in result.stdout


def test_a_second_init_ca_without_force_fails_and_leaves_the_ca_alone(
    operator: Operator,
) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0
    before = {name: (operator.home / "ca" / name).read_bytes() for name in ("ca.key", "ca.crt")}

    again = operator.run("init-ca", "--dir", "ca")

    assert again.code == 1
    assert "refusing to overwrite" in again.stderr
    assert "--force" in again.stderr
    after = {name: (operator.home / "ca" / name).read_bytes() for name in ("ca.key", "ca.crt")}
    assert after == before


def test_init_ca_with_force_replaces_the_ca(operator: Operator) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0
    old = (operator.home / "ca" / "ca.crt").read_bytes()

    assert operator.run("init-ca", "--dir", "ca", "--force").code == 0

    assert (operator.home / "ca" / "ca.crt").read_bytes() != old
    assert mode(operator.home / "ca" / "ca.key") == 0o600


def test_server_node_and_operator_certificates_are_issued_from_the_ca(
    operator: Operator,
) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0
    ca = load_ca(operator.home / "ca")

    server = operator.run(
        "server", "--dir", "ca", "--out", "out", "--host", "llmgw.internal",
        "--ip", "127.0.0.5", "--ip", "127.0.0.1",
    )  # fmt: skip
    node = operator.run("node", "gpu-07", "--dir", "ca", "--days", "30")
    person = operator.run("operator", "alice", "--dir", "ca", "--out", "out")

    assert (server.code, node.code, person.code) == (0, 0, 0), server.stderr + node.stderr
    assert "llmgw.internal" in server.stdout
    assert "127.0.0.5, 127.0.0.1" in server.stdout
    issued = {
        "out/server": "server",
        "ca/node-gpu-07": "node",
        "out/operator-alice": "operator",
    }
    for stem, unit in issued.items():
        certificate = load_certificate(operator.home / f"{stem}.crt")
        certificate.verify_directly_issued_by(ca.certificate)
        units = certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        assert [attribute.value for attribute in units] == [unit]
        assert mode(operator.home / f"{stem}.key") == 0o600
    node_certificate = load_certificate(operator.home / "ca" / "node-gpu-07.crt")
    lifetime = node_certificate.not_valid_after_utc - node_certificate.not_valid_before_utc
    assert lifetime.days == 30


def test_show_describes_a_certificate_in_words_and_in_json(operator: Operator) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0
    assert operator.run("server", "--dir", "ca", "--ip", "127.0.0.5").code == 0

    text = operator.run("show", "ca/server.crt")
    as_json = operator.run("show", "ca/server.crt", "--output", "json")

    assert text.code == 0, text.stderr
    assert "server certificate" in text.stdout
    assert "127.0.0.5" in text.stdout
    assert "server authentication" in text.stdout
    assert as_json.code == 0, as_json.stderr
    described = json.loads(as_json.stdout)
    assert described["kind"] == "server"
    assert described["ip_addresses"] == ["127.0.0.5"]
    assert described["expired"] is False


def test_a_bad_ip_is_a_usage_error(operator: Operator) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0

    result = operator.run("server", "--dir", "ca", "--ip", "10.0.0.999")

    assert result.code == 2
    assert "invalid IP address '10.0.0.999'" in result.stderr
    assert not (operator.home / "ca" / "server.crt").exists()


def test_a_bad_node_id_is_a_usage_error(operator: Operator) -> None:
    result = operator.run("node", "gpu/07", "--dir", "ca")

    assert result.code == 2
    assert "invalid node id 'gpu/07'" in result.stderr


def test_issuing_without_a_ca_says_to_create_one_first(operator: Operator) -> None:
    result = operator.run("node", "gpu-07", "--dir", "nowhere")

    assert result.code == 1
    assert "no CA in nowhere (ca.crt, ca.key missing)" in result.stderr
    assert "run `llmgw-cli cert init-ca --dir nowhere` first" in result.stderr


def test_issuing_with_a_ca_key_others_can_read_fails_and_says_how_to_fix_it(
    operator: Operator,
) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0
    (operator.home / "ca" / "ca.key").chmod(0o644)

    result = operator.run("node", "gpu-07", "--dir", "ca")

    assert result.code == 1
    assert "ca/ca.key can be read by users other than its owner (mode 0644)" in result.stderr
    assert "`chmod 600 ca/ca.key`" in result.stderr
    assert not (operator.home / "ca" / "node-gpu-07.key").exists()


def test_llmgw_ca_dir_chooses_the_default_directory(operator: Operator) -> None:
    environment_dir = operator.home / "from-env"
    completed = subprocess.run(
        [console_script(), "cert", "init-ca"],
        env=os.environ | {"LLMGW_CA_DIR": str(environment_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert (environment_dir / "ca.key").exists()


@pytest.mark.parametrize("command", ["init-ca", "server", "node", "operator", "show"])
def test_every_command_help_carries_an_example(operator: Operator, command: str) -> None:
    result = operator.run(command, "--help")

    assert result.code == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert any(line.startswith(f"llmgw-cli cert {command} ") for line in lines), result.stdout


# -- lifetimes ---------------------------------------------------------------------------


def test_a_certificate_that_would_outlive_its_ca_is_refused_with_what_is_possible(
    operator: Operator,
) -> None:
    assert operator.run("init-ca", "--dir", "ca", "--days", "30").code == 0

    node = operator.run("node", "gpu-07", "--dir", "ca", "--days", "31")
    server = operator.run("server", "--dir", "ca", "--ip", "127.0.0.5")  # 825 days by default

    for result, days in ((node, 31), (server, 825)):
        assert result.code == 2, result.stderr
        assert f"a certificate valid for {days} days would outlive the CA" in result.stderr
        assert "issue it for at most 29 days" in result.stderr
        assert "Traceback" not in result.stderr
    assert not (operator.home / "ca" / "node-gpu-07.crt").exists()
    assert not (operator.home / "ca" / "server.crt").exists()
    within = operator.run("node", "gpu-07", "--dir", "ca", "--days", "29")
    assert within.code == 0, within.stderr


@pytest.mark.parametrize("days", ["3650000", "10001", "0", "-5"])
@pytest.mark.parametrize(
    "command",
    [
        ("init-ca", "--dir", "fresh"),
        ("server", "--dir", "ca", "--ip", "127.0.0.5"),
        ("node", "gpu-07", "--dir", "ca"),
        ("operator", "alice", "--dir", "ca"),
    ],
    ids=["init-ca", "server", "node", "operator"],
)
def test_days_out_of_bounds_are_a_usage_error_not_a_traceback(
    operator: Operator, command: tuple[str, ...], days: str
) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0

    result = operator.run(*command, "--days", days)

    assert result.code == 2, result.stdout + result.stderr
    assert f"--days must be between 1 and 10000 (about 27 years), not {days}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (operator.home / "fresh").exists()
    assert sorted(p.name for p in (operator.home / "ca").iterdir()) == ["ca.crt", "ca.key"]


# -- for scripts ---------------------------------------------------------------------------


def test_every_issuing_command_prints_json_for_scripts(operator: Operator) -> None:
    created = operator.run("init-ca", "--dir", "ca", "--output", "json")
    issued = {
        "server": operator.run(
            "server", "--dir", "ca", "--ip", "127.0.0.1", "--out", "s", "--output", "json"
        ),
        "node": operator.run("node", "gpu-07", "--dir", "ca", "--out", "n", "--output", "json"),
        "operator": operator.run("operator", "alice", "--dir", "ca", "--output", "json"),
    }

    assert created.code == 0, created.stderr
    ca = json.loads(created.stdout)
    assert Path(ca["certificate"]) == operator.home / "ca" / "ca.crt"
    assert ca["description"]["is_ca"] is True
    for kind, result in issued.items():
        assert result.code == 0, (kind, result.stderr)
        written = json.loads(result.stdout)
        certificate = load_certificate(Path(written["certificate"]))
        assert Path(written["key"]).exists()
        assert written["description"]["kind"] == kind
        assert written["description"]["serial"] == format(certificate.serial_number, "x")
    assert json.loads(issued["node"].stdout)["description"]["common_name"] == "gpu-07"


def test_list_warns_of_a_ca_and_of_current_certificates_near_their_end(
    operator: Operator,
) -> None:
    """Weeks before a CA ends (and every certificate it issued with it), `cert list` says
    so; before, it listed them as in order until the day they were refused."""
    assert operator.run("init-ca", "--dir", "ca", "--days", "20").code == 0
    for days in ("3", "10"):  # gpu-07's second certificate supersedes its first
        issued = operator.run(
            "node", "gpu-07", "--dir", "ca", "--days", days, "--offline", "--force"
        )
        assert issued.code == 0, issued.stderr
    assert operator.run("operator", "alice", "--dir", "ca", "--days", "15").code == 0

    listed = operator.run("list", "--dir", "ca", "--offline")

    assert listed.code == 0, listed.stderr
    ca_line, leaf_line = listed.stderr.splitlines()
    assert "the CA in ca expires on " in ca_line
    assert "(in 19 days)" in ca_line
    assert "rotate it now" in ca_line
    assert leaf_line.startswith("llmgw-cli cert list: 2 current certificate(s)")
    assert "the soonest, node gpu-07, ends on " in leaf_line


def test_list_says_nothing_of_ends_far_away(operator: Operator) -> None:
    assert operator.run("init-ca", "--dir", "ca").code == 0
    assert operator.run("node", "gpu-07", "--dir", "ca", "--offline").code == 0

    listed = operator.run("list", "--dir", "ca", "--offline")

    assert listed.code == 0
    assert listed.stderr == ""
