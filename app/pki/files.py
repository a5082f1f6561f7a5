"""The CA on disk: keys are created 0600 and never widened, nothing is overwritten silently."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from app.pki.describe import is_ca
from app.pki.errors import (
    CaNotFound,
    CertificateFileError,
    RefusedOverwrite,
    UnprotectedKey,
    UnreadableFile,
)
from app.pki.keys import PrivateKey, certificate_pem, private_key_pem
from app.pki.limits import MAX_PEM_FILE_BYTES
from app.pki.model import CertificateAuthority
from app.regular_file import FileRefused, not_a_directory, read_regular_file

CA_CERTIFICATE = "ca.crt"
CA_KEY = "ca.key"
KEY_MODE = 0o600
CERTIFICATE_MODE = 0o644
DIRECTORY_MODE = 0o700


@dataclass(frozen=True)
class PemFile:
    path: Path
    content: bytes
    mode: int


@dataclass(frozen=True)
class IssuedFiles:
    certificate: Path
    key: Path


def write_ca(ca_dir: Path, ca: CertificateAuthority, *, force: bool) -> IssuedFiles:
    files = IssuedFiles(certificate=ca_dir / CA_CERTIFICATE, key=ca_dir / CA_KEY)
    _write_pair(files, ca.certificate, ca.key, force=force)
    return files


def write_issued(
    out_dir: Path, stem: str, certificate: x509.Certificate, key: PrivateKey, *, force: bool
) -> IssuedFiles:
    """Write `<stem>.crt` and `<stem>.key` into `out_dir`."""
    files = IssuedFiles(certificate=out_dir / f"{stem}.crt", key=out_dir / f"{stem}.key")
    _write_pair(files, certificate, key, force=force)
    return files


def write_files(files: Sequence[PemFile], *, force: bool) -> None:
    """Write every file, or, without force, refuse before writing any if one exists."""
    if not force:
        existing = tuple(file.path for file in files if os.path.lexists(file.path))
        if existing:
            raise RefusedOverwrite(existing)
    for file in files:
        _make_directory(file.path.parent)
        if force:
            _replace(file)
        else:
            _create(file)


def load_ca(ca_dir: Path) -> CertificateAuthority:
    if (problem := not_a_directory(ca_dir)) is not None:
        # Told apart from a CA not made yet: `init-ca --dir` of this path would fail too.
        raise UnreadableFile(
            ca_dir, f"{problem}: give the CA's directory ({CA_CERTIFICATE}, {CA_KEY})"
        )
    certificate_path, key_path = ca_dir / CA_CERTIFICATE, ca_dir / CA_KEY
    missing = tuple(path.name for path in (certificate_path, key_path) if not path.exists())
    if missing:
        raise CaNotFound(ca_dir, missing)
    certificate = load_certificate(certificate_path)
    if not is_ca(certificate):
        raise UnreadableFile(certificate_path, "is not a CA certificate")
    _check_private(key_path)
    key = load_private_key(key_path)
    if key.public_key() != certificate.public_key():
        raise UnreadableFile(key_path, f"is not the key of {certificate_path}")
    return CertificateAuthority(certificate=certificate, key=key)


def load_certificate(path: Path) -> x509.Certificate:
    data = _read(path)
    try:
        if b"-----BEGIN" in data:
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        what = "it is a private key" if b"PRIVATE KEY" in data else "no PEM or DER X.509 found"
        raise UnreadableFile(path, f"not a certificate ({what})") from exc


def load_private_key(path: Path) -> PrivateKey:
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise UnreadableFile(path, f"not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, PrivateKey):
        raise UnreadableFile(path, f"not an ECDSA key ({type(key).__name__})")
    return key


def _write_pair(
    files: IssuedFiles, certificate: x509.Certificate, key: PrivateKey, *, force: bool
) -> None:
    write_files(
        [
            PemFile(path=files.key, content=private_key_pem(key), mode=KEY_MODE),
            PemFile(
                path=files.certificate,
                content=certificate_pem(certificate),
                mode=CERTIFICATE_MODE,
            ),
        ],
        force=force,
    )


def _check_private(key_path: Path) -> None:
    """Refuse to sign with a CA key other users can read, as ssh refuses such a key: whoever
    copied it can issue certificates the whole cluster accepts, and saying so is the only
    way its owner learns it."""
    try:
        mode = stat.S_IMODE(key_path.stat().st_mode)
    except OSError as exc:
        raise UnreadableFile(key_path, exc.strerror or str(exc)) from exc
    if mode & 0o077:
        raise UnprotectedKey(key_path, mode)


def _create(file: PemFile) -> None:
    try:
        descriptor = os.open(file.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file.mode)
    except FileExistsError as exc:
        raise RefusedOverwrite((file.path,)) from exc
    except OSError as exc:
        raise CertificateFileError(f"cannot create {file.path}: {exc.strerror}") from exc
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(file.content)
    except OSError as exc:
        file.path.unlink(missing_ok=True)
        raise CertificateFileError(f"cannot write {file.path}: {exc.strerror}") from exc


def _replace(file: PemFile) -> None:
    # Written beside the target and renamed over it, so the new file has its own mode from
    # the start instead of keeping whatever the old one had.
    temporary = file.path.with_name(f".{file.path.name}.{secrets.token_hex(4)}.tmp")
    _create(PemFile(path=temporary, content=file.content, mode=file.mode))
    try:
        os.replace(temporary, file.path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise CertificateFileError(f"cannot replace {file.path}: {exc.strerror}") from exc


def _make_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        # mkdir says only "File exists" of a file or a dangling link in the directory's place.
        problem = (not_a_directory(directory) if exc.errno == errno.EEXIST else None) or (
            exc.strerror
        )
        raise CertificateFileError(f"cannot create directory {directory}: {problem}") from exc


def _read(path: Path) -> bytes:
    """The file's bytes: a regular file of at most ``MAX_PEM_FILE_BYTES``, never waited on."""
    try:
        return read_regular_file(path, MAX_PEM_FILE_BYTES, holder="a certificate or key file")
    except FileRefused as exc:
        raise UnreadableFile(path, exc.reason) from exc
