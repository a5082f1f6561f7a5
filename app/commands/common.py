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


HeaderTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_HEADER_TIMEOUT",
        help="seconds a client has to send a request's headers (from connecting, or from "
        "the first byte of the next request); then it gets 408 and is disconnected",
    ),
]
BodyTimeout = Annotated[
    float,
    Parameter(
        env_var="LLMGW_BODY_TIMEOUT",
        help="seconds a client has to send a request's body once its headers are in; then "
        "it gets 408 and is disconnected",
    ),
]


AuthFailureBurst = Annotated[
    int,
    Parameter(
        env_var="LLMGW_AUTH_FAILURE_BURST",
        help="wrong keys or tokens one client address may send at once before it gets 429 "
        "with Retry-After",
    ),
]
AuthFailuresPerMinute = Annotated[
    float,
    Parameter(
        env_var="LLMGW_AUTH_FAILURES_PER_MINUTE",
        help="wrong keys or tokens an address earns back each minute",
    ),
]


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)
