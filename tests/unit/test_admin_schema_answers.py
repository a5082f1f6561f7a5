"""The admin API's OpenAPI schema says what each request is answered: the status its
handler sets, with the body the handler returns, and a 400 as the problem document the API
really writes. A client generated from the schema reads each answer by what the schema
says; one told that a refusal holds ``status_code`` and ``extra`` finds neither.

The routes and the schema are the app's own, as ``create_admin_app`` builds them (no
database is reached: nothing is served)."""

from __future__ import annotations

from typing import Any

import msgspec

from app.admin.errors import problem_body
from tests.support.admin_routes import admin_app, component, operations

PROBLEM = "application/problem+json"


def test_every_operation_is_answered_with_the_status_its_handler_sets() -> None:
    wrong: list[str] = []
    for operation in operations(admin_app()):
        responses = operation.schema["responses"]
        success = str(operation.handler.status_code)
        said = sorted(code for code in responses if code.startswith("2"))
        if said != [success]:
            wrong.append(f"{operation} answers {success}, says {said}")
        content = responses.get(success, {}).get("content")
        if success == "204" and content:
            wrong.append(f"{operation} answers 204 with nothing, says {sorted(content)}")
        if success != "204" and set(content or ()) != {"application/json"}:
            wrong.append(f"{operation} answers JSON, says {content}")

    assert wrong == []


def test_every_operation_describes_its_400_as_the_problem_document_the_api_writes() -> None:
    # Every request may be a 400: a query parameter it does not take is one, and so is an
    # Authorization header sent twice.
    app = admin_app()
    schema = app.openapi_schema.to_schema()
    media_type, document = problem_body(400, "the request body must be a JSON object")
    written = set(msgspec.json.decode(document))

    wrong: list[str] = []
    shapes: list[dict[str, Any]] = []
    for operation in operations(app):
        content = operation.schema["responses"].get("400", {}).get("content", {})
        if set(content) != {PROBLEM}:
            wrong.append(f"{operation}'s 400 is {PROBLEM}, says {sorted(content)}")
        else:
            shapes.append(content[PROBLEM]["schema"])

    assert wrong == []
    assert media_type.decode() == PROBLEM
    _, problem = component(schema, shapes[0])
    assert all(shape == shapes[0] for shape in shapes)
    assert set(problem["required"]) == written
    assert set(problem["properties"]) == written | {"errors"}
    # What a field to blame says: app.admin.bodies's and Litestar's own (a message, and
    # mostly the field and where it was sent).
    [listed] = problem["properties"]["errors"]["oneOf"]
    _, field = component(schema, listed["items"])
    assert set(field["properties"]) == {"key", "message", "source"}
    assert field["required"] == ["message"]
