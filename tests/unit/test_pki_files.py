"""The CA on disk: private keys are 0600 from birth and nothing is overwritten silently."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from app.pki.builders import build_ca, issue_node
from app.pki.errors import (
    CaNotFound,
    CertificateFileError,
    RefusedOverwrite,
    UnprotectedKey,
    UnreadableFile,
)
from app.pki.files import load_ca, load_certificate, write_ca, write_issued
from app.pki.keys import generate_key
from app.pki.model import CertificateAuthority

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MAX_PEM_FILE_BYTES = 512 * 1024
"""``app.pki.limits.MAX_PEM_FILE_BYTES``, as its refusals say it."""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return build_ca(generate_key(), "llmgw CA", NOW, 3650)


def test_the_ca_key_is_private_and_the_certificate_readable(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    files = write_ca(tmp_path / "ca", ca, force=False)

    assert mode(files.key) == 0o600
    assert mode(files.certificate) == 0o644
    assert mode(tmp_path / "ca") == 0o700


def test_a_written_ca_loads_back(tmp_path: Path, ca: CertificateAuthority) -> None:
    write_ca(tmp_path, ca, force=False)

    loaded = load_ca(tmp_path)

    assert loaded.certificate == ca.certificate
    assert loaded.key.private_numbers() == ca.key.private_numbers()


def test_an_existing_file_is_named_and_left_untouched_without_force(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    files = write_ca(tmp_path, ca, force=False)
    before = files.key.read_bytes(), files.certificate.read_bytes()
    other = build_ca(generate_key(), "another CA", NOW, 10)

    with pytest.raises(RefusedOverwrite, match="refusing to overwrite") as refused:
        write_ca(tmp_path, other, force=False)

    assert set(refused.value.paths) == {files.key, files.certificate}
    assert (files.key.read_bytes(), files.certificate.read_bytes()) == before


def test_nothing_is_written_when_only_one_of_the_pair_exists(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    (tmp_path / "node-gpu-07.crt").write_text("someone else's\n")
    certificate = issue_node(ca, generate_key(), "gpu-07", NOW, 1)

    with pytest.raises(RefusedOverwrite):
        write_issued(tmp_path, "node-gpu-07", certificate, generate_key(), force=False)

    assert not (tmp_path / "node-gpu-07.key").exists()


def test_force_replaces_a_key_with_a_fresh_0600_file(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    key_path = tmp_path / "node-gpu-07.key"
    key_path.write_text("old\n")
    key_path.chmod(0o644)
    key = generate_key()

    write_issued(tmp_path, "node-gpu-07", issue_node(ca, key, "gpu-07", NOW, 1), key, force=True)

    assert mode(key_path) == 0o600
    assert b"PRIVATE KEY" in key_path.read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "node-gpu-07.crt",
        "node-gpu-07.key",
    ]


def test_a_missing_ca_says_which_files_are_missing(tmp_path: Path) -> None:
    with pytest.raises(CaNotFound) as missing:
        load_ca(tmp_path)

    assert missing.value.missing == ("ca.crt", "ca.key")
    assert missing.value.ca_dir == tmp_path


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda path: path.write_text("x\n"), "not a directory but a regular file"),
        (lambda path: os.mkfifo(path), "not a directory but a named pipe (FIFO)"),
        (
            lambda path: path.symlink_to(path.parent / "gone"),
            "a symbolic link to {parent}/gone, which does not exist",
        ),
    ],
    ids=["file", "fifo", "dangling-link"],
)
def test_a_ca_directory_that_is_something_else_is_refused_as_what_it_is(
    tmp_path: Path, make: Callable[[Path], object], what: str
) -> None:
    # Before, each was "no CA in PATH (ca.crt, ca.key missing)", and the advice to run
    # `cert init-ca --dir PATH`, which fails on it too.
    ca_dir = tmp_path / "ca"
    make(ca_dir)

    with pytest.raises(UnreadableFile) as refused:
        load_ca(ca_dir)

    assert str(refused.value) == (
        f"{ca_dir}: {what.format(parent=tmp_path)}: give the CA's directory (ca.crt, ca.key)"
    )


def test_a_directory_to_write_in_that_is_a_fifo_is_refused_as_one(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    # Before, "cannot create directory PATH: File exists", of a path that is no directory.
    fifo = tmp_path / "out"
    os.mkfifo(fifo)

    with pytest.raises(CertificateFileError) as refused:
        write_ca(fifo, ca, force=False)

    assert str(refused.value) == (
        f"cannot create directory {fifo}: not a directory but a named pipe (FIFO)"
    )


def test_a_ca_key_that_does_not_fit_the_certificate_is_refused(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    mismatched = CertificateAuthority(certificate=ca.certificate, key=generate_key())
    write_ca(tmp_path, mismatched, force=False)

    with pytest.raises(UnreadableFile, match="is not the key of"):
        load_ca(tmp_path)


def test_a_leaf_certificate_is_not_a_ca(tmp_path: Path, ca: CertificateAuthority) -> None:
    key = generate_key()
    leaf = CertificateAuthority(issue_node(ca, key, "gpu-07", NOW, 1), key)
    write_ca(tmp_path, leaf, force=False)

    with pytest.raises(UnreadableFile, match="not a CA certificate"):
        load_ca(tmp_path)


def test_reading_a_key_as_a_certificate_says_so(tmp_path: Path, ca: CertificateAuthority) -> None:
    files = write_ca(tmp_path, ca, force=False)

    with pytest.raises(UnreadableFile, match="it is a private key"):
        load_certificate(files.key)


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604, 0o660])
def test_a_ca_key_other_users_can_read_is_refused_and_left_as_it_is(
    tmp_path: Path, ca: CertificateAuthority, loose: int
) -> None:
    """Before, the CA signed with a key anyone on the machine could have copied, and its
    owner never learned that the whole cluster's trust was in the open."""
    files = write_ca(tmp_path, ca, force=False)
    files.key.chmod(loose)
    before = files.key.read_bytes()

    with pytest.raises(UnprotectedKey, match=rf"\(mode 0{loose:o}\).*`chmod 600 {files.key}`"):
        load_ca(tmp_path)

    assert mode(files.key) == loose
    assert files.key.read_bytes() == before


@pytest.mark.timeout(10)
def test_a_certificate_path_that_is_no_regular_file_is_refused_unread(tmp_path: Path) -> None:
    # Before, /dev/zero was read until memory ran out, and a FIFO waited for a writer for
    # ever.
    fifo = tmp_path / "node.crt"
    os.mkfifo(fifo)

    for path, kind in [
        (Path("/dev/zero"), "a character device"),
        (fifo, "a named pipe (FIFO)"),
        (tmp_path, "a directory"),
    ]:
        with pytest.raises(UnreadableFile) as refused:
            load_certificate(path)
        assert str(refused.value) == f"{path}: not a regular file but {kind}"


def test_a_certificate_file_over_512_kib_is_refused_unread(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    pem = ca.certificate.public_bytes(Encoding.PEM)
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes(pem * (MAX_PEM_FILE_BYTES // len(pem) + 1))

    with pytest.raises(UnreadableFile) as refused:
        load_certificate(bundle)
    assert str(refused.value) == (
        f"{bundle}: {bundle.stat().st_size:,} bytes, over the 512 KiB a certificate or key "
        "file may hold"
    )
    bundle.write_bytes(pem * (MAX_PEM_FILE_BYTES // len(pem)))
    assert load_certificate(bundle) == ca.certificate
