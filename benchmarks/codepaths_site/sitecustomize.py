"""Records the project's call chain at each point where llmgw acts on the outside world.

Loaded by ``benchmarks/codepaths.py`` through ``PYTHONPATH`` into every process of a
traced cluster; it does nothing unless ``CODEPATHS_DIR`` names a directory. It wraps the
few calls by which a process affects another (an append through ``llmgw_append``, a
WebSocket frame other than a heartbeat, an HTTP request from the CLI, an engine spawned
or signalled) and writes, for each, the time and the project frames on the stack: the
chain of functions a reader follows from the entry point to that effect.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGES = ("app", "agent", "cli", "wire", "devcluster")
EVENT_LOOP = os.path.join("asyncio", "events.py")
"""Where a task's step starts: frames below it are the loop's caller, not the task's path."""
LOGGING = f"{os.sep}structlog{os.sep}"
"""A function the logging library calls back (a processor) is not a step of the path."""


def _install(directory: Path, root: Path) -> None:
    prefixes = tuple(f"{root / package}{os.sep}" for package in PACKAGES)
    out = (directory / f"{os.getpid()}.jsonl").open("a", buffering=1)

    def record(sink: str) -> None:
        chain: list[list[str]] = []
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.endswith(EVENT_LOOP):
                break
            if filename.startswith(prefixes):
                chain.append([str(Path(filename).relative_to(root)), frame.f_code.co_qualname])
            frame = frame.f_back
        out.write(
            json.dumps({"t": time.time(), "sink": sink, "argv": sys.argv[:2], "chain": chain[::-1]})
            + "\n"
        )

    _profile_calls(out, prefixes, root)

    def wrap(owner: Any, name: str, sink: str, wanted: Callable[..., bool]) -> None:
        original = getattr(owner, name)
        if getattr(original, "__codepaths__", False):
            return
        if _is_coroutine_function(original):

            @functools.wraps(original)
            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                if wanted(*args, **kwargs):
                    record(sink)
                return await original(*args, **kwargs)

            traced_async.__codepaths__ = True  # type: ignore[attr-defined]
            setattr(owner, name, traced_async)
        else:

            @functools.wraps(original)
            def traced(*args: Any, **kwargs: Any) -> Any:
                if wanted(*args, **kwargs):
                    record(sink)
                return original(*args, **kwargs)

            traced.__codepaths__ = True  # type: ignore[attr-defined]
            setattr(owner, name, traced)

    def always(*_args: Any, **_kwargs: Any) -> bool:
        return True

    def appends(_connection: Any, query: Any = "", *_args: Any, **_kwargs: Any) -> bool:
        return "llmgw_append" in str(query)

    def not_heartbeat(_connection: Any, message: Any = "", *_args: Any, **_kwargs: Any) -> bool:
        text = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
        return '"heartbeat' not in text

    for name in ("killpg", "kill", "posix_spawnp", "posix_spawn"):
        if hasattr(os, name):
            wrap(os, name, f"os.{name}", always)
    try:
        import asyncpg.connection

        for name in ("fetch", "fetchrow", "fetchval", "execute", "executemany"):
            wrap(asyncpg.connection.Connection, name, "append", appends)
    except ImportError:
        pass
    try:
        import websockets.asyncio.connection

        wrap(websockets.asyncio.connection.Connection, "send", "frame", not_heartbeat)
    except ImportError:
        pass
    try:
        import httpx

        wrap(httpx.Client, "send", "http", always)
    except ImportError:
        pass


def _profile_calls(out: Any, prefixes: tuple[str, ...], root: Path) -> None:
    """Every call into project code, as (tenth of a second, nearest project caller, callee),
    written about twice a second: what each function on a chain called along the way."""
    import threading

    edges: set[tuple[int, Any, Any]] = set()
    flushed = [time.time()]

    def key(code: Any) -> list[str]:
        return [str(Path(code.co_filename).relative_to(root)), code.co_qualname]

    def flush() -> None:
        batch = list(edges)
        edges.clear()
        flushed[0] = time.time()
        for tenth, caller, callee in batch:
            out.write(
                json.dumps({"tenth": tenth, "caller": key(caller), "callee": key(callee)}) + "\n"
            )

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(prefixes):
            return
        back = frame.f_back
        while back is not None and not back.f_code.co_filename.startswith(prefixes):
            if back.f_code.co_filename.endswith(EVENT_LOOP) or LOGGING in back.f_code.co_filename:
                return
            back = back.f_back
        if back is None:
            return
        now = time.time()
        edges.add((int(now * 10), back.f_code, code))
        if now - flushed[0] > 0.5:
            flush()

    import atexit

    atexit.register(flush)
    sys.setprofile(hook)
    threading.setprofile(hook)


def _is_coroutine_function(function: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


_directory = os.environ.get("CODEPATHS_DIR")
_root = os.environ.get("CODEPATHS_ROOT")
if _directory and _root:
    _install(Path(_directory), Path(_root).resolve())
