"""The simulator's listening sockets, bound before the server starts.

    sockets = listening_sockets("127.0.0.1", 8001)   # or ListenError: port 8001 ... in use

uvicorn binds its own sockets when it is given a host and a port, and a bind that fails
ends the process with uvicorn's code 3 and a log line of its own. Bound here, the failure
is the simulator's to tell: one line and exit code 1, as every llmgw program tells a port
it cannot start on (``agent.simulator.serve``). The sockets are bound as asyncio's
``create_server`` binds them for uvicorn: one per address the host resolves to,
``SO_REUSEADDR`` set, an IPv6 one for IPv6 only.
"""

from __future__ import annotations

import errno
import socket


class ListenError(Exception):
    """No socket could be bound on the host and port; the message says why."""


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """A bound socket for every address ``host`` resolves to, at ``port`` (not yet listening:
    the server listens on them). Raises ``ListenError`` naming the host and port."""
    try:
        addresses = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ListenError(
            f"cannot listen on {host}: {exc.strerror}; choose another --host"
        ) from exc
    sockets: list[socket.socket] = []
    seen: set[tuple[object, ...]] = set()
    try:
        for family, kind, proto, _, address in addresses:
            if (family, *address) in seen:
                continue
            seen.add((family, *address))
            sockets.append(_bound(family, kind, proto, address, host, port))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bound(
    family: socket.AddressFamily,
    kind: socket.SocketKind,
    proto: int,
    address: tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes],
    host: str,
    port: int,
) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"port {port} on {host} is in use; choose another with --port"
            ) from exc
        raise ListenError(f"cannot listen on {host} port {port}: {exc.strerror}") from exc
    return sock
