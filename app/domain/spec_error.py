"""One thing wrong with a spec, as every check of one reports it."""

from __future__ import annotations

import msgspec


class SpecError(msgspec.Struct, frozen=True):
    """One thing wrong with a spec: the field and why, in words an operator can act on."""

    field: str
    reason: str
