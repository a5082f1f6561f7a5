"""The wall clock the shell hands to what it builds: services, stores and the control plane
take a ``clock`` parameter (the domain never reads time), and this is its default."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

utc_now: Callable[[], datetime] = partial(datetime.now, UTC)
"""Now, timezone-aware, in UTC."""
