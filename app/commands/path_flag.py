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
        name=flag, env_var=env_var, help=help_text, converter=_FilledPath(flag, env_var)
    )


@dataclass(frozen=True)
class _FilledPath:
    """cyclopts' converter for one ``path_flag``."""

    flag: str
    env_var: str

    def __call__(self, _type: object, tokens: Sequence[Token]) -> Path:
        value = tokens[0].value
        if not value.strip():
            otherwise = "unset it" if tokens[0].source == "env" else "leave the flag out"
            # Raised as cyclopts' own error, this line is printed as it is; a ValueError
            # would be prefixed with only the one name the value came by.
            raise CoercionError(
                msg=f"{self.flag} ({self.env_var}) is empty: give a path, or {otherwise}"
            )
        return Path(value)
