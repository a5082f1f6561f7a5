"""A file flag of ``llmgw-server``, also set by its environment variable, that is never
given empty. ``Path("")`` is the current directory: ``LLMGW_TLS_CERT=""`` (a variable meant
to be filled in and left blank) would otherwise be refused only later, as a certificate
that is a directory named ".", which says nothing of the setting to mend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cyclopts import CoercionError, Parameter, Token


def path_flag(flag: str, env_var: str, help_text: str) -> Parameter:
    """The ``Parameter`` of the file flag ``flag`` (``--tls-cert``) that ``env_var`` sets
    too. Given empty or blank by either, the command ends as bad usage (exit 2) before it
    starts, naming both."""
    return Parameter(
        name=flag, env_var=env_var, help=help_text, converter=FilledPath(flag, env_var)
    )


@dataclass(frozen=True)
class FilledPath:
    """cyclopts' converter for a file flag that must not be given empty (one of
    ``path_flag``'s, or a flag no variable sets: ``env_var`` None)."""

    flag: str
    env_var: str | None = None

    def __call__(self, _type: object, tokens: Sequence[Token]) -> Path:
        value = tokens[0].value
        if not value.strip():
            otherwise = "unset it" if tokens[0].source == "env" else "leave the flag out"
            # Raised as cyclopts' own error, this line is printed as it is; a ValueError
            # would be prefixed with only the one name the value came by.
            raise CoercionError(msg=f"{self._named} is empty: give a path, or {otherwise}")
        return Path(value)

    @property
    def _named(self) -> str:
        return self.flag if self.env_var is None else f"{self.flag} ({self.env_var})"
