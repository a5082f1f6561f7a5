from tests.support.databases import (
    database_pool,
    database_url,
    engine,
    migrated_template,
    pg_store,
)

__all__ = ["database_pool", "database_url", "engine", "migrated_template", "pg_store"]
