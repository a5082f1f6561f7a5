"""The admin API's OpenAPI schema says of every request body what its handler reads: a
client generated from the schema sends each request a body of the type the handler decodes,
required where the handler cannot do without one, and no body where it reads none.

The check walks the app's own routes, as ``create_admin_app`` builds them, and the schema it
generates (no database is reached: nothing is served). A handler reads its body either
through Litestar (its ``data`` parameter) or by hand (``await request.body()``, for errors
that name each field of a model spec). One that reads it by hand must declare what it
decodes (``app.admin.operation_schema.body_read_by_hand``): Litestar cannot see it, and the
schema would offer no body at all, so that a generated client could not send the one thing
the request exists for."""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import msgspec
import pytest
from litestar.handlers import HTTPRouteHandler

from app.admin.model_schemas import ModelSpecBody
from tests.support.admin_routes import REFERENCE, Operation, admin_app, component, operations

HAND_READ = re.compile(r"\brequest\.(?:body|json|form|msgpack|stream)\(")
"""How a handler reads its request's body itself rather than through ``data``."""
HAND_READ_BODIES: dict[tuple[str, str], type[msgspec.Struct]] = {
    ("PUT", "/admin/v1/models/{name}"): ModelSpecBody,
    ("POST", "/admin/v1/models/{name}/preview"): ModelSpecBody,
    ("POST", "/admin/v1/placement"): ModelSpecBody,
}
"""The requests whose handler reads its body by hand, and what it decodes it into
(``app.admin.models.spec_from_body``: a model spec)."""


@dataclass(frozen=True)
class Body:
    """A request body: the struct it decodes into, and whether a request needs one."""

    struct: type[msgspec.Struct]
    required: bool


def struct_of(annotation: Any) -> tuple[type[msgspec.Struct], bool]:
    """The struct ``annotation`` names, and whether it also admits null."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        assert len(members) == 1, annotation
        return members[0], True
    return annotation, False


def reads_by_hand(handler: HTTPRouteHandler) -> bool:
    return HAND_READ.search(inspect.getsource(handler.fn)) is not None


def body_read(operation: Operation) -> Body | None:
    """The body ``operation``'s handler really reads, found from the handler itself."""
    data = operation.handler.parsed_fn_signature.parameters.get("data")
    if data is not None:
        struct, _ = struct_of(data.annotation)
        return Body(struct, required=not data.has_default)
    if reads_by_hand(operation.handler):
        decoded = HAND_READ_BODIES.get((operation.method, operation.path))
        assert decoded is not None, f"{operation} reads its body by hand: into what?"
        return Body(decoded, required=True)
    return None


def body_declared(
    operation: Operation, schema: dict[str, Any]
) -> tuple[str, dict[str, Any], bool] | None:
    """The component the schema names as ``operation``'s JSON body, its schema, and whether
    the body is required."""
    request_body = operation.schema.get("requestBody")
    if request_body is None:
        return None
    assert set(request_body["content"]) == {"application/json"}, operation
    name, shape = component(schema, request_body["content"]["application/json"]["schema"])
    return name, shape, bool(request_body.get("required"))


def wire_fields(struct: type[msgspec.Struct]) -> tuple[set[str], set[str]]:
    """Every field ``struct`` decodes, and those a body must hold."""
    fields = msgspec.structs.fields(struct)
    required = {f.encode_name for f in fields if f.required}
    return {f.encode_name for f in fields}, required


def test_every_body_a_handler_reads_is_declared_as_what_it_decodes() -> None:
    app = admin_app()
    schema = app.openapi_schema.to_schema()

    wrong: list[str] = []
    for operation in operations(app):
        read = body_read(operation)
        declared = body_declared(operation, schema)
        if read is None and declared is None:
            continue
        if read is None:
            wrong.append(f"{operation} declares a body {declared and declared[0]} it never reads")
            continue
        if declared is None:
            wrong.append(f"{operation} reads a {read.struct.__name__} the schema does not declare")
            continue
        name, shape, required = declared
        fields, needed = wire_fields(read.struct)
        said = (name, set(shape.get("properties", {})), set(shape.get("required", [])))
        if said != (read.struct.__name__, fields, needed):
            wrong.append(f"{operation} reads a {read.struct.__name__}, declares {said}")
        if required != read.required:
            wrong.append(f"{operation} body required: reads {read.required}, says {required}")

    assert wrong == []


@pytest.mark.parametrize(("method", "path"), sorted(HAND_READ_BODIES))
def test_a_model_spec_is_the_required_body_of_each_request_that_reads_one(
    method: str, path: str
) -> None:
    schema = admin_app().openapi_schema.to_schema()

    request_body = schema["paths"][path][method.lower()]["requestBody"]

    assert request_body["required"] is True
    assert request_body["content"] == {
        "application/json": {"schema": {"$ref": f"{REFERENCE}ModelSpecBody"}}
    }
    spec = schema["components"]["schemas"]["ModelSpecBody"]
    assert spec["required"] == ["command"]
    assert set(spec["properties"]) == wire_fields(ModelSpecBody)[0]
    _, routing = component(schema, spec["properties"]["routing"])
    policy = routing["properties"]["policy"]
    assert set(policy["enum"]) == {"least_loaded", "prefix", "session", None}


def test_the_check_finds_every_handler_that_reads_its_body_by_hand() -> None:
    by_hand = {
        (operation.method, operation.path)
        for operation in operations(admin_app())
        if reads_by_hand(operation.handler)
    }

    assert by_hand == set(HAND_READ_BODIES)


def structs_within(struct: type[msgspec.Struct]) -> Iterator[type[msgspec.Struct]]:
    """``struct`` and every struct that one of its fields holds, however deep."""
    seen: set[type[msgspec.Struct]] = set()
    pending: list[msgspec.inspect.Type] = [msgspec.inspect.type_info(struct)]
    while pending:
        info = pending.pop()
        if isinstance(info, msgspec.inspect.StructType) and info.cls not in seen:
            seen.add(info.cls)
            pending.extend(field.type for field in info.fields)
        elif isinstance(info, msgspec.inspect.UnionType):
            pending.extend(info.types)
        elif isinstance(info, msgspec.inspect.DictType):
            pending.append(info.value_type)
        elif isinstance(
            info, (msgspec.inspect.ListType, msgspec.inspect.SetType, msgspec.inspect.VarTupleType)
        ):
            pending.append(info.item_type)
    yield from sorted(seen, key=lambda cls: cls.__name__)


def test_a_body_that_refuses_fields_it_does_not_have_is_declared_closed() -> None:
    # Every body refuses a field it does not have (400, or 422 in a spec) rather than
    # ignore it: a client made from a schema that allows more would send them.
    app = admin_app()
    schema = app.openapi_schema.to_schema()
    structs = {
        inner
        for operation in operations(app)
        if (read := body_read(operation)) is not None
        for inner in structs_within(read.struct)
    }

    said = {
        struct.__name__: schema["components"]["schemas"][struct.__name__].get(
            "additionalProperties", True
        )
        for struct in structs
    }

    assert "CanaryStepBody" in said
    assert said == {s.__name__: not s.__struct_config__.forbid_unknown_fields for s in structs}
