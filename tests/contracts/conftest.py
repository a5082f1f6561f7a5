from tests.support.databases import database_url, engine, migrated_template, pg_store

__all__ = ["database_url", "engine", "migrated_template", "pg_store"]
