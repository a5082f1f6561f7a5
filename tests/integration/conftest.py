from tests.support.cluster import cluster
from tests.support.databases import database_url, engine, migrated_template, pg_store
from tests.support.operator_cli import operator
from tests.support.real_engine import real_engine
from tests.support.tcp_relay import relay
from tests.support.two_operators import admin_url, alice, bob

__all__ = [
    "admin_url",
    "alice",
    "bob",
    "cluster",
    "database_url",
    "engine",
    "migrated_template",
    "operator",
    "pg_store",
    "real_engine",
    "relay",
]
