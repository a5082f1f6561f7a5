from tests.support.cluster import cluster
from tests.support.databases import database_url, engine, migrated_template, pg_store

__all__ = ["cluster", "database_url", "engine", "migrated_template", "pg_store"]
