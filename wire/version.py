"""The version of llmgw this program is: what every program's ``--version`` prints and what
an agent reports in its hello."""

from __future__ import annotations

UNKNOWN = "unknown"


def llmgw_version() -> str:
    """The installed distribution's version; ``unknown`` when run from a tree that was never
    installed."""
    # importlib.metadata (email, zipfile, csv) is a twentieth of a second of every start:
    # loaded only when a version is asked for.
    import importlib.metadata

    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN
