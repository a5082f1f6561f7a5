"""Driver errors as the store's: what SQLAlchemy's asyncpg dialect raises when PostgreSQL
refuses a new connection while it starts, shuts down or restarts is "the database is
unavailable" (503 for the admin API, try again), not a database error (500)."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.dialects.postgresql.asyncpg import (
    AsyncAdapt_asyncpg_connection,
    AsyncAdapt_asyncpg_dbapi,
)
from sqlalchemy.exc import DBAPIError

from app.store.database import answer_error, store_error
from app.store.errors import PrivilegeRefused, RoleRefused, StoreError, StoreUnavailable

DBAPI = AsyncAdapt_asyncpg_dbapi(asyncpg)


def as_sqlalchemy_raises_it(error: Exception) -> DBAPIError:
    """``error`` from asyncpg, translated by the dialect and wrapped as the pool raises it
    when a connection cannot be opened."""
    try:
        AsyncAdapt_asyncpg_connection._handle_exception_no_connection(DBAPI, error)
    except DBAPI.Error as adapted:
        wrapped = DBAPIError.instance("connect", None, adapted, DBAPI.Error)
        assert isinstance(wrapped, DBAPIError)
        return wrapped
    raise AssertionError("the dialect did not translate it")


@pytest.mark.parametrize(
    ("refusal", "said"),
    [
        (
            asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
            "shutting down",
        ),
        (
            asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
            "starting up",
        ),
        (
            asyncpg.exceptions.AdminShutdownError(
                "terminating connection due to administrator command"
            ),
            "administrator command",
        ),
    ],
)
def test_a_database_that_refuses_connections_for_now_is_unavailable(
    refusal: Exception, said: str
) -> None:
    error = store_error(as_sqlalchemy_raises_it(refusal))

    assert isinstance(error, StoreUnavailable), error
    assert said in str(error)


@pytest.mark.parametrize(
    ("refusal", "refused_as"),
    [
        (
            asyncpg.exceptions.InsufficientPrivilegeError("permission denied for table events"),
            PrivilegeRefused,
        ),
        (
            asyncpg.exceptions.InvalidAuthorizationSpecificationError('role "x" does not exist'),
            RoleRefused,
        ),
        (
            asyncpg.exceptions.InvalidPasswordError('password authentication failed for user "x"'),
            RoleRefused,
        ),
    ],
)
def test_a_refused_role_is_told_apart_from_the_database_being_away(
    refusal: Exception, refused_as: type[RoleRefused]
) -> None:
    error = store_error(as_sqlalchemy_raises_it(refusal))

    assert type(error) is refused_as
    assert isinstance(error, RoleRefused)
    assert str(refusal) in str(error)


def test_a_missing_privilege_is_told_by_its_code_in_any_language() -> None:
    """A server set to answer in another language says "permission denied" otherwise:
    SQLSTATE 42501 is what tells a missing privilege from a role not let in at all."""
    french = asyncpg.exceptions.InsufficientPrivilegeError("droit refusé pour la table models")
    refused = asyncpg.exceptions.InvalidPasswordError(
        "l'authentification par mot de passe a échoué pour l'utilisateur « x »"
    )

    assert isinstance(answer_error(french), PrivilegeRefused)
    assert not isinstance(answer_error(refused), PrivilegeRefused)


def test_a_role_that_does_not_exist_is_named() -> None:
    unknown = asyncpg.exceptions.InvalidAuthorizationSpecificationError(
        'role "auditor" does not exist'
    )
    password = asyncpg.exceptions.InvalidPasswordError(
        'password authentication failed for user "auditor"'
    )

    missing = store_error(as_sqlalchemy_raises_it(unknown))
    refused = store_error(as_sqlalchemy_raises_it(password))

    assert isinstance(missing, RoleRefused)
    assert missing.missing_role == "auditor"
    assert isinstance(refused, RoleRefused)
    assert refused.missing_role is None


def test_any_other_refusal_is_a_database_error() -> None:
    refusal = asyncpg.exceptions.UndefinedTableError('relation "events" does not exist')

    error = store_error(as_sqlalchemy_raises_it(refusal))

    assert type(error) is StoreError
    assert 'relation "events" does not exist' in str(error)


DRIVER_STATE = "cannot switch to state 11; another operation (2) is in progress"
"""What asyncpg says when the server ended the session in the middle of an operation."""


def test_a_connection_ended_in_the_middle_of_an_operation_is_said_in_plain_words() -> None:
    internal = asyncpg.InternalClientError(DRIVER_STATE)
    forms = [
        internal,
        DBAPIError.instance(None, None, internal, DBAPI.Error, connection_invalidated=True),
        DBAPIError.instance("SELECT 1", None, internal, DBAPI.Error),
    ]

    for form in forms:
        error = store_error(form)

        assert isinstance(error, StoreUnavailable), (form, error)
        assert str(error) == (
            "the connection to the database was ended during the operation (its session was "
            "ended by an administrator or a timeout, or the database restarted or failed over)"
        )
