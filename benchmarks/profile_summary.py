"""Where a py-spy profile of the gateway spends its samples, grouped.

    python benchmarks/profile_summary.py PROFILE.collapsed [--top 20]

Reads py-spy's ``--format raw`` output (one stack a line, outermost frame first, frames
separated by ``;``, then the number of samples) as ``benchmarks/gateway.py --profile``
writes it, and prints, for the groups below and for the functions themselves:

* **self**: the samples whose innermost Python frame is in it (time in C code a Python
  function called, a C extension's parser or encoder, a system call, is its caller's);
* **cumulative**: the samples with a Python frame of it anywhere on the stack, or whose
  leaf is of it (the frames under every stack, the process's main and ``uvloop.run``,
  excepted; of C frames, only the leaf counts: py-spy's native stacks repeat the
  interpreter's and the loop's under everything).

With ``--native`` profiles the leaf may be C: a system call, the garbage collector, the
interpreter, uvloop's loop; those are groups of their own.

A frame belongs to the first group whose pattern its file or function matches.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

GROUPS: tuple[tuple[str, str], ...] = (
    # Native frames (py-spy --native): the leaf of a stack that left Python.
    (
        "system calls",
        r"^(write|read|writev|readv|send|recv|sendmsg|recvmsg|sendto|recvfrom"
        r"|epoll_wait|epoll_pwait|getpid|__libc_\w+|syscall) \(libc",
    ),
    (
        "garbage collector",
        r"^(gc_collect\w*|collect_generations|deduce_unreachable"
        r"|move_unreachable|visit_\w+|subtract_refs|update_refs) ",
    ),
    # Python frames, and the C code of the extensions the request path uses.
    ("logging", r"structlog|/logging/|app/logs"),
    ("metrics", r"prometheus_client|app/gateway/metrics\.py|app/gateway/traffic\.py"),
    ("JSON", r"msgspec|/json/"),
    (
        "HTTP server (parsing, protocol, ASGI cycle)",
        r"uvicorn/protocols|httptools|/h11/|parser\.c"
        r"|app/listeners/(httpserver|exchange|http11)\.py",
    ),
    ("ASGI layers", r"uvicorn/|starlette|app/gateway/app\.py|app/listeners/"),
    ("engine client", r"app/gateway/engine_(client|answer|connection|bounds|errors)\.py"),
    (
        "router's choice",
        r"app/gateway/(router|lease|waiter|replica_pools|route_refusals|affinity|ejection)\.py",
    ),
    ("admission, fair queue", r"app/gateway/(admission|fairqueue)\.py"),
    ("keys, rate limits, usage", r"app/domain/keys|hashlib|app/gateway/(ratelimit|usage)\.py"),
    ("the app's request handling", r"app/"),
    ("event loop", r"uvloop|asyncio/|selectors|_asynciomodule|loop\.c|uv_|uv__|libuv"),
    ("interpreter", r"libpython|object\.h|ceval|\bPy|_Py"),
)
"""Order matters: the first match wins (the metrics module before the rest of app/)."""
BASE = r"benchmarks/|asyncio/runners\.py|uvloop/__init__\.py|<module>"
"""Frames under every stack (the process's main, ``uvloop.run``): not counted as any
group's cumulative time, which would make it 100 %."""
OTHER = "other"
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<where>[^()]*)\)$")


def group_of(frame: str) -> str:
    for name, pattern in GROUPS:
        if re.search(pattern, frame):
            return name
    return OTHER


def _short(frame: str) -> str:
    """``function (path/to/file.py:LINE)`` as ``function (to/file.py)``: one name per
    function, whatever its line."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    where = match["where"].rsplit(":", 1)[0]
    parts = where.split("/")
    return f"{match['function']} ({'/'.join(parts[-2:])})"


def read(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def summarize(stacks: list[tuple[list[str], int]], top: int) -> str:
    total = sum(count for _, count in stacks)
    if not total:
        return "no samples"
    group_self: Counter[str] = Counter()
    group_cumulative: Counter[str] = Counter()
    function_self: Counter[str] = Counter()
    function_cumulative: Counter[str] = Counter()
    for frames, count in stacks:
        group_self[group_of(frames[-1])] += count
        on_stack = {
            group_of(frame) for frame in frames if ".py:" in frame and not re.search(BASE, frame)
        }
        for name in on_stack | {group_of(frames[-1])}:
            group_cumulative[name] += count
        function_self[_short(frames[-1])] += count
        for name in {_short(frame) for frame in frames}:
            function_cumulative[name] += count

    def share(count: int) -> str:
        return f"{100 * count / total:5.1f} %"

    lines = [f"{total} samples", "", "| group | self | cumulative |", "| --- | ---: | ---: |"]
    names = [name for name, _ in GROUPS] + [OTHER]
    for name in sorted(names, key=lambda name: -group_self[name]):
        if group_cumulative[name]:
            lines.append(
                f"| {name} | {share(group_self[name])} | {share(group_cumulative[name])} |"
            )
    lines += ["", f"top {top} functions, self:", ""]
    lines += [f"  {share(count)}  {name}" for name, count in function_self.most_common(top)]
    lines += ["", f"top {top} functions, cumulative:", ""]
    lines += [f"  {share(count)}  {name}" for name, count in function_cumulative.most_common(top)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy --format raw output")
    parser.add_argument("--top", type=int, default=20)
    arguments = parser.parse_args(argv)
    if not arguments.profile.is_file():
        print(f"no such file: {arguments.profile}", file=sys.stderr)
        return 2
    print(summarize(read(arguments.profile), arguments.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
