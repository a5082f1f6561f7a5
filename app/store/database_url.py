"""PostgreSQL URLs as operators write them, with one host or several.

libpq, and so psql, Patroni's documentation and managed services, write several hosts in
the authority, each with its own port, and let ``target_session_attrs`` choose among them:

    postgresql://llmgw:secret@db-a:5432,db-b:5432/llmgw?target_session_attrs=read-write

asyncpg takes that form as it is and tries the hosts in order until one satisfies
``target_session_attrs`` (``read-write``: the primary). SQLAlchemy's URL parser does not:
it wants the hosts as repeated ``host=h:p`` query parameters and an empty authority. This
module parses the URL once and writes it in both forms, so that ``serve`` and ``gateway``
connect through the pool and through their own connections (the leader lock, LISTEN) to
the same server, and find the new primary by themselves after a failover.

A URL that cannot be one (another scheme, an empty host in the list, a port that is not a
number, an unknown ``target_session_attrs``) raises ``InvalidDatabaseUrl`` with a message
that says which part is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")
DEFAULT_PORT = 5432
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
"""What libpq and asyncpg accept for ``target_session_attrs``."""
_PASSWORD_PARAMETER = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
"""libpq's ``?password=`` (asyncpg reads it too), shown as ``***``."""
QUERY_SAFE = "/:"
"""Left as they are in query values: socket directories and ``host:port`` read better."""


class InvalidDatabaseUrl(ValueError):
    """The database URL cannot be parsed; the message says which part is wrong."""


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed ``postgresql://`` URL: credentials, one or more ``(host, port)``, the
    database and the other query parameters, in order."""

    hosts: tuple[tuple[str, int | None], ...]
    """Empty: the driver's default (a local socket)."""
    database: str
    username: str | None = None
    password: str | None = None
    query: tuple[tuple[str, str], ...] = ()

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1

    def with_credentials(self, username: str, password: str | None) -> DatabaseUrl:
        return replace(self, username=username, password=password)

    def libpq(self) -> str:
        """``postgresql://user:pass@h1:p1,h2:p2/db?...``: libpq's and asyncpg's form."""
        hosts = ",".join(_host_port(host, port) for host, port in self.hosts)
        query = f"?{urlencode(self.query, safe=QUERY_SAFE)}" if self.query else ""
        return f"postgresql://{self._userinfo()}{hosts}/{quote(self.database, safe='')}{query}"

    def sqlalchemy(self) -> str:
        """The ``postgresql+asyncpg://`` URL SQLAlchemy parses: one host in the authority,
        or, for several, each as a ``host=h:p`` parameter (every one with its port)."""
        database = quote(self.database, safe="")
        if not self.multi_host:
            query = f"?{urlencode(self.query, safe=QUERY_SAFE)}" if self.query else ""
            authority = "".join(_host_port(host, port) for host, port in self.hosts)
            return f"postgresql+asyncpg://{self._userinfo()}{authority}/{database}{query}"
        hosts = [("host", f"{host}:{port or DEFAULT_PORT}") for host, port in self.hosts]
        query = urlencode([*hosts, *self.query], safe=QUERY_SAFE)
        return f"postgresql+asyncpg://{self._userinfo()}/{database}?{query}"

    def _userinfo(self) -> str:
        if self.username is None:
            return ""
        user = quote(self.username, safe="")
        if self.password is None:
            return f"{user}@"
        return f"{user}:{quote(self.password, safe='')}@"


def parse_database_url(url: str) -> DatabaseUrl:
    """Parse ``url`` (``postgresql://``, ``postgres://`` or ``postgresql+asyncpg://``, with
    one host or a comma-separated list in the authority, or SQLAlchemy's ``host=``
    parameters); raises ``InvalidDatabaseUrl``."""
    scheme, separator, _rest = url.partition("://")
    if not separator or scheme not in SCHEMES:
        raise InvalidDatabaseUrl(
            f"the database URL must start with postgresql://, not {_shown(url)!r}"
        )
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user)
        password = unquote(secret) if colon else None
    query: list[tuple[str, str]] = []
    hosts = [_parse_host(one, url) for one in hostlist.split(",")] if hostlist else []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "host" and not hostlist and not value.startswith("/"):
            hosts.append(_parse_host(value, url))  # SQLAlchemy's form; "/..." is a socket
        else:
            query.append((key, value))
    attrs = dict(query).get("target_session_attrs")
    if attrs is not None and attrs not in SESSION_ATTRS:
        raise InvalidDatabaseUrl(
            f"target_session_attrs={attrs!r} in the database URL is not one of "
            f"{', '.join(SESSION_ATTRS)}"
        )
    database = unquote(parts.path.lstrip("/"))
    return DatabaseUrl(tuple(hosts), database, username, password, tuple(query))


def _parse_host(text: str, url: str) -> tuple[str, int | None]:
    if text.startswith("["):  # an IPv6 address: [::1]:5432
        address, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidDatabaseUrl(f"host {text!r} in the database URL {_shown(url)!r}")
        host, port_text = f"[{address}]", rest[1:]
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise InvalidDatabaseUrl(
            f"the database URL {_shown(url)!r} has an empty host in its list of hosts"
        )
    if not port_text:
        return host, None
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) <= 65535:
        raise InvalidDatabaseUrl(
            f"port {port_text!r} of host {host} in the database URL {_shown(url)!r} "
            "is not a port number"
        )
    return host, int(port_text)


def _host_port(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


def _shown(url: str) -> str:
    """``url`` with any password replaced, for messages: whatever stands between the
    user's name and the authority's last ``@`` (as the parser reads it, so an unescaped
    ``@`` or ``/`` in a password hides no part of it), with a scheme or without one, and
    libpq's ``password`` parameter."""
    main, mark, query = url.partition("?")
    separator = main.find("://")
    start = separator + 3 if separator >= 0 else 0
    at = main.rfind("@")
    if at > start and ":" in main[start:at]:
        user = main[start:at].partition(":")[0]
        main = f"{main[:start]}{user}:***{main[at:]}"
    return main + _PASSWORD_PARAMETER.sub(r"\1***", mark + query)
