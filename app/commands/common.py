"""What every ``llmgw-server`` command shares: the database URL flag and failing in one line."""

from __future__ import annotations

import sys
from typing import Annotated

from cyclopts import Parameter

DatabaseUrl = Annotated[
    str,
    Parameter(
        env_var="LLMGW_DATABASE_URL",
        help="PostgreSQL URL, e.g. postgresql://llmgw@db:5432/llmgw.",
    ),
]


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)
