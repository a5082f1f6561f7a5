"""Database URLs with one host or libpq's list of several, as the pool (SQLAlchemy) and the
driver's own connections (asyncpg) each take them, and a clear error for one that cannot
be a URL."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import dialect
from sqlalchemy.engine import make_url

from app.store.database import driver_url, sqlalchemy_url
from app.store.database_url import InvalidDatabaseUrl, parse_database_url

FAILOVER_URL = (
    "postgresql://llmgw:s%40cret@db-a:5432,db-b:5433/llmgw?target_session_attrs=read-write"
)


def test_several_hosts_reach_asyncpg_through_sqlalchemy_each_with_its_port() -> None:
    url = make_url(sqlalchemy_url(FAILOVER_URL))

    _, arguments = dialect().create_connect_args(url)

    assert arguments == {
        "host": ["db-a", "db-b"],
        "port": [5432, 5433],
        "user": "llmgw",
        "password": "s@cret",
        "database": "llmgw",
        "target_session_attrs": "read-write",
    }


def test_the_driver_gets_the_libpq_form_back_whichever_form_it_was_given() -> None:
    assert driver_url(FAILOVER_URL) == FAILOVER_URL
    assert driver_url(sqlalchemy_url(FAILOVER_URL)) == FAILOVER_URL


def test_a_host_without_a_port_gets_the_default_one_where_sqlalchemy_needs_it() -> None:
    url = make_url(sqlalchemy_url("postgres://db-a,db-b/llmgw"))

    assert dialect().create_connect_args(url)[1]["port"] == [5432, 5432]
    assert driver_url("postgres://db-a,db-b/llmgw") == "postgresql://db-a,db-b/llmgw"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://llmgw@127.0.0.1:5432/llmgw",
        "postgresql+asyncpg://llmgw:pw@db:6543/llmgw?ssl=require",
        "postgresql://llmgw@[::1]:5432/llmgw",
        "postgresql://llmgw@/llmgw?host=/var/run/postgresql",
    ],
)
def test_one_host_urls_read_as_before(url: str) -> None:
    plain = url.replace("postgresql+asyncpg://", "postgresql://")

    assert driver_url(url) == plain
    assert sqlalchemy_url(url) == plain.replace("postgresql://", "postgresql+asyncpg://")


def test_credentials_are_replaced_on_every_host() -> None:
    url = parse_database_url(FAILOVER_URL).with_credentials("runtime", "p w")

    assert url.libpq() == (
        "postgresql://runtime:p%20w@db-a:5432,db-b:5433/llmgw?target_session_attrs=read-write"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://db/llmgw", "must start with postgresql://"),
        ("postgresql://db-a,,db-b/llmgw", "an empty host"),
        ("postgresql://db-a:5432,db-b:port/llmgw", "port 'port' of host db-b"),
        ("postgresql://db-a:70000/llmgw", "not a port number"),
        ("postgresql://db-a:\u00b2/llmgw", "not a port number"),
        ("postgresql://db-a:\u0665\u0664\u0663\u0662/llmgw", "not a port number"),
        ("postgresql://db-a/llmgw?target_session_attrs=primay", "target_session_attrs='primay'"),
    ],
)
def test_a_malformed_url_is_refused_with_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidDatabaseUrl, match=says):
        parse_database_url(url)


def test_a_password_is_never_shown_in_the_error() -> None:
    with pytest.raises(InvalidDatabaseUrl) as refused:
        parse_database_url("postgresql://llmgw:hunter2@db-a,,db-b/llmgw")

    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "llmgw:hunter2@db-a/llmgw",  # the scheme forgotten
        "postgresql:/llmgw:hunter2@db-a/llmgw",  # a slash short
        "mysql://llmgw:hunter2@db-a/llmgw",
        "postgresql://llmgw:hun@ter2@db-a,,db-b/llmgw",  # an '@' left unescaped in it
        "postgresql://llmgw@db-a,,db-b/llmgw?password=hunter2",  # libpq's parameter
        "postgresql://llmgw@db-a:port/llmgw?sslmode=require&password=hunter2",
    ],
)
def test_no_part_of_a_password_is_shown_however_the_url_is_wrong(url: str) -> None:
    with pytest.raises(InvalidDatabaseUrl) as refused:
        parse_database_url(url)

    message = str(refused.value)
    assert "hunter2" not in message
    assert "ter2" not in message
    assert "***" in message
