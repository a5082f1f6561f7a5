"""How the commands that check the database (``llmgw-server projections rebuild
[--verify]``, ``log verify``, ``log head``) end when they could not check, so that a script
run from cron tells "the check found something" from "no check was made", and why not:

====  =====================================================================================
code  meaning
====  =====================================================================================
1     the command's own finding: differences found (``--verify``), the chain broken
2     the command line was refused before connecting, as every llmgw command refuses it
3     ``DATABASE_UNANSWERED``: the database could not be reached, gave no answer within
      ``--answer-timeout``, or a lock held elsewhere kept a statement waiting; trying again
      later may work
4     ``ROLE_REFUSED``: the database refused the role (no such role, a password refused,
      a privilege it lacks); another role is the fix, not trying again
5     ``COULD_NOT_CHECK``: the database answered, but what was to be checked cannot be
      read (no such database, a schema not migrated, an event that no longer decodes)
====  =====================================================================================

Each code means the same for every one of these commands, and 5 is no other llmgw
command's (``serve``'s 3 is a lost leadership, ``llmgw-sim-engine``'s a failure).
"""

from __future__ import annotations

import asyncpg

from app.commands.answer_wait import causes
from app.store.errors import RoleRefused, StoreError
from app.store.grants import DEFAULT_RUNTIME_ROLE

DATABASE_UNANSWERED = 3
ROLE_REFUSED = 4
COULD_NOT_CHECK = 5


def missing_role_problem(exc: RoleRefused, role_that_may: str) -> str | None:
    """What to do about a role the database does not know, as ``role_that_may`` (``a role
    that may read the log (the runtime role may)``) is to connect instead; None when the
    database refused the role for another reason."""
    if exc.missing_role is None:
        return None
    return (
        f'the role "{exc.missing_role}" of --database-url (LLMGW_DATABASE_URL) does not '
        f"exist on this PostgreSQL server; connect as {role_that_may}: the server's "
        "administrator creates roles (createuser, or CREATE ROLE), and `llmgw-server migrate "
        f"--runtime-role {DEFAULT_RUNTIME_ROLE}` creates the runtime role where the owner may "
        "create roles (docs/operations.md, PostgreSQL)"
    )


def unreadable_problem(exc: StoreError) -> str:
    """Why what was to be checked could not be read (``exc``, neither a silent database nor
    a refused role), with what to do: a database that does not exist is told apart from a
    schema not migrated by PostgreSQL's code, as both are said to "not exist"."""
    if any(isinstance(cause, asyncpg.InvalidCatalogNameError) for cause in causes(exc)):
        return f"{exc} (check the database name of --database-url, LLMGW_DATABASE_URL)"
    if any(isinstance(cause, _NOT_MIGRATED) for cause in causes(exc)):
        return f"{exc} (is the database at the newest revision? llmgw-server migrate)"
    return str(exc)


_NOT_MIGRATED = (asyncpg.UndefinedTableError, asyncpg.UndefinedFunctionError)
"""What PostgreSQL answers a statement on a table or function an older schema lacks."""
