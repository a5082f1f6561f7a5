"""A listener that cannot bind its address, named: ``CannotListen`` says which listener,
on which address, and what the operator can do about it.

A server has several listeners (the admin API, the agent hub, the gateway's clients, its
metrics) and the system's "Address already in use" names none of them.
"""

from __future__ import annotations

import errno
import os
import socket

REMEDIES = {
    errno.EADDRINUSE: "stop what listens there, or choose another port",
    errno.EADDRNOTAVAIL: "give an address of this machine, or 0.0.0.0 for all of them",
    errno.EACCES: "choose a port from 1024 up, or run as a user allowed to bind it",
}


def bound_listener(
    what: str, host: str, port: int, *, reuse_port: bool = False, no_delay: bool = False
) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (not yet listening), for ``what``; raises
    ``CannotListen``. ``reuse_port``: shared with every process that binds the port so
    (``SO_REUSEPORT``); ``no_delay``: its connections send small writes at once
    (``TCP_NODELAY``)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise CannotListen(what, host, port, exc) from exc
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            if not hasattr(socket, "SO_REUSEPORT"):
                raise OSError("this platform has no SO_REUSEPORT: run one gateway per port")
            # Every process that sets it before binding shares the port; the kernel hashes
            # each new connection to one of them.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if no_delay:
            # Accepted connections inherit it: without it, a stream's small writes (its
            # head, then each event) wait on the client's delayed ACK, adding milliseconds
            # to each.
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind(address)
    except OSError as exc:
        listener.close()
        raise CannotListen(what, host, port, exc) from exc
    return listener


class CannotListen(OSError):
    """``what`` (``admin API (--admin-host, --admin-port)``) could not bind ``host``:``port``;
    the errno is the system's."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        # asyncio's own strerror repeats the address: the system's words alone.
        if isinstance(cause, socket.gaierror) or not cause.errno:
            reason = str(cause.strerror or cause)
        else:
            reason = os.strerror(cause.errno)
        remedy = REMEDIES.get(cause.errno or 0)
        message = f"the {what} cannot listen on {host}:{port}: {reason}"
        super().__init__(cause.errno, message + (f"; {remedy}" if remedy else ""))

    def __str__(self) -> str:
        return str(self.strerror)
