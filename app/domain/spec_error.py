"""One thing wrong with a spec, as every check of one reports it, and the check that
records it."""

from __future__ import annotations

from collections.abc import Callable

import msgspec


class SpecError(msgspec.Struct, frozen=True):
    """One thing wrong with a spec: the field and why, in words an operator can act on."""

    field: str
    reason: str


Need = Callable[[bool, str, str], None]
"""``need(ok, field, reason)``: one check of a spec, which records ``SpecError(field,
reason)`` unless ``ok``."""


def need_into(errors: list[SpecError]) -> Need:
    """The check a validator asks of each field, recording into ``errors`` what fails."""

    def need(ok: bool, field: str, reason: str) -> None:
        if not ok:
            errors.append(SpecError(field, reason))

    return need
