"""Errors raised by the private CA.

::

    PkiError                      anything below; catch this at an edge
     +-- InvalidRequest           a name, host, IP, validity or clock the CA cannot use
     +-- CertificateFileError     reading or writing the CA's files
     |    +-- RefusedOverwrite    the file exists and force was not given
     |    +-- CaNotFound          no CA (ca.crt + ca.key) in the directory
     |    +-- UnreadableFile      not a PEM certificate or key, or a key that does not fit
     |    +-- UnprotectedKey      a CA key that users other than its owner can read
     +-- TlsConfigurationError    files that could not be loaded into an ssl.SSLContext
     |    +-- CertificateNotYetValid  one whose validity starts later by this machine's clock
     +-- CertificateRejected      a verified peer certificate that is still not acceptable
"""

from __future__ import annotations

from pathlib import Path


class PkiError(Exception):
    """Base of every error the private CA raises."""


class InvalidRequest(PkiError):
    """The certificate asked for cannot be built as requested."""


class CertificateFileError(PkiError):
    """A CA, certificate or key file could not be read or written."""


class RefusedOverwrite(CertificateFileError):
    def __init__(self, paths: tuple[Path, ...]) -> None:
        self.paths = paths
        listed = ", ".join(str(path) for path in paths)
        super().__init__(f"refusing to overwrite {listed} (pass --force to replace)")


class CaNotFound(CertificateFileError):
    def __init__(self, ca_dir: Path, missing: tuple[str, ...]) -> None:
        self.ca_dir = ca_dir
        self.missing = missing
        super().__init__(f"no CA in {ca_dir} ({', '.join(missing)} missing)")


class UnreadableFile(CertificateFileError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class UnprotectedKey(CertificateFileError):
    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.mode = mode
        super().__init__(
            f"{path} can be read by users other than its owner (mode {mode:04o}), and whoever "
            f"copied it can issue certificates the whole cluster accepts: `chmod 600 {path}`, "
            "and if anyone else may have read it, create a new CA and reissue every "
            "certificate (docs/certificates.md, Rotation)"
        )


class TlsConfigurationError(PkiError):
    """Certificate, key or CA files that an ssl.SSLContext refused to load."""


class CertificateNotYetValid(TlsConfigurationError):
    """This side's own certificate starts later than this machine's clock says it is now:
    unlike the other refusals, time fixes it (a clock set right by NTP, or the start simply
    coming), so a supervisor's restart may well succeed."""


class CertificateRejected(PkiError):
    """A peer certificate that passed the handshake but must not be accepted here."""
