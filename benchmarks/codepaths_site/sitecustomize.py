"""Records the project's call chain at each point where llmgw acts on the outside world.

Loaded by ``benchmarks/codepaths.py`` through ``PYTHONPATH`` into every process of a
traced cluster; it does nothing unless ``CODEPATHS_DIR`` names a directory. It wraps the
few calls by which a process affects another (an append through ``llmgw_append``, a
WebSocket frame other than a heartbeat, an HTTP request from the CLI, an engine spawned
or signalled) and writes, for each, the time and the project frames on the stack: the
chain of functions a reader follows from the entry point to that effect.

It also profiles every call into project code and writes those calls every tenth of a
second from a thread of its own, each batch followed by ``{"flushed": t}``: the calls made
before ``t`` are on file (but for one another thread was adding at that very instant,
which the next batch carries). A process is SIGKILLed moments after the last phase ends
(the agents and the server when the scenario's cluster is reaped), so the scenario waits
for a mark past the phase's end from every process still running: what a process called
in its last moments is not lost with it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
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
FLUSH_EVERY_S = 0.1
"""How often the calls profiled are written, whether or not the process calls anything."""


def _install(directory: Path, root: Path) -> None:
    prefixes = tuple(f"{root / package}{os.sep}" for package in PACKAGES)
    out = _Records(directory / f"{os.getpid()}.jsonl")

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
        out.write([{"t": time.time(), "sink": sink, "argv": sys.argv[:2], "chain": chain[::-1]}])

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


class _Records:
    """A process's records file. Each batch of lines goes out in one ``write`` to a file
    opened for appending, so lines from several threads never mix; no lock is taken (a
    child forked while a thread held one would wait for it for ever)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, records: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(record) + "\n" for record in records).encode()
        while data:
            data = data[os.write(self._fd, data) :]


def _profile_calls(out: _Records, prefixes: tuple[str, ...], root: Path) -> None:
    """Every call into project code, as (tenth of a second, nearest project caller, callee),
    written every ``FLUSH_EVERY_S`` by a thread of its own and at exit: what each function
    on a chain called along the way."""
    edges: set[tuple[int, Any, Any]] = set()

    def key(code: Any) -> list[str]:
        return [str(Path(code.co_filename).relative_to(root)), code.co_qualname]

    def flush() -> None:
        flushed_at = time.time()
        # A copy, then taking away what was copied, each one step under the GIL: a call
        # another thread adds meanwhile stays for the next batch.
        batch = edges.copy()
        edges.difference_update(batch)
        out.write(
            [
                {"tenth": tenth, "caller": key(caller), "callee": key(callee)}
                for tenth, caller, callee in batch
            ]
            + [{"flushed": flushed_at}]
        )

    def flush_for_ever() -> None:
        sys.setprofile(None)
        while True:
            time.sleep(FLUSH_EVERY_S)
            flush()

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
        edges.add((int(time.time() * 10), back.f_code, code))

    import atexit

    atexit.register(flush)
    threading.Thread(target=flush_for_ever, name="codepaths-flush", daemon=True).start()
    sys.setprofile(hook)
    threading.setprofile(hook)


def _is_coroutine_function(function: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


_directory = os.environ.get("CODEPATHS_DIR")
_root = os.environ.get("CODEPATHS_ROOT")
if _directory and _root:
    _install(Path(_directory), Path(_root).resolve())
