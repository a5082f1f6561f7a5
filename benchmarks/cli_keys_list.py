"""How long ``llmgw-cli keys list`` takes for many keys, table and JSON side by side.

    python benchmarks/cli_keys_list.py [--keys 2000] [--rounds 5] [--columns 80]

A stand-in admin API on loopback (a thread of this process) answers ``/admin/v1/keys``
with ``--keys`` synthetic keys, paged as the admin API pages them; the installed
``llmgw-cli`` runs as a process of its own, as an operator runs it, ``--rounds`` times for
each output, its stdout a pipe of ``--columns`` columns. The figures are the medians of the
wall times. ``--output json`` does all the table does but lay the table out (start, fetch,
decode), so the difference between the two is the table's own time. The admin API itself
is left out: it answers 2,000 keys in about 15 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import msgspec

CLI = Path(sys.executable).with_name("llmgw-cli")


def synthetic_keys(count: int) -> list[dict[str, object]]:
    return [
        {
            "id": f"k-{n:08x}",
            "prefix": f"{n:08x}",
            "name": f"key-number-{n}",
            "models": ["llama-3-8b", "qwen-2-7b"] if n % 3 else ["*"],
            "rpm": 60 if n % 2 else None,
            "tpm": 100_000 if n % 4 else None,
            "created_at": "2026-03-05T16:00:00Z",
            "created_by": "alice",
            "revoked": n % 5 == 0,
            "revoked_at": "2026-03-06T16:00:00Z" if n % 5 == 0 else None,
            "revoked_by": "bob" if n % 5 == 0 else None,
            "expires_at": "2027-01-01T00:00:00Z" if n % 7 == 0 else None,
            "expired": False,
        }
        for n in range(count)
    ]


def serve(keys: list[dict[str, object]]) -> ThreadingHTTPServer:
    ids = [key["id"] for key in keys]

    class Keys(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            start = ids.index(query["after"][0]) + 1 if "after" in query else 0
            limit = int(query["limit"][0]) if "limit" in query else len(keys)
            body = msgspec.json.encode(keys[start : start + limit])
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def timed(url: str, output: str, columns: int) -> float:
    environment = {**os.environ, "LLMGW_CONFIG": "/dev/null", "COLUMNS": str(columns)}
    started = time.perf_counter()
    subprocess.run(
        [str(CLI), "keys", "list", "--admin-url", url, "--output", output],
        env=environment,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--columns", type=int, default=80)
    options = parser.parse_args()
    server = serve(synthetic_keys(options.keys))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for output in ("table", "json"):
            times = [timed(url, output, options.columns) for _ in range(options.rounds)]
            print(
                f"keys list --output {output:5} {options.keys} keys, {options.columns} columns: "
                f"median {statistics.median(times):.2f} s (of {options.rounds})"
            )
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
