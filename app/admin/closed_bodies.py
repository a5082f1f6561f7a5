"""The OpenAPI schema of a request body that refuses fields it does not have.

Every body the admin API reads is a struct with ``forbid_unknown_fields``: a misspelt field
is refused (400, or 422 in a model spec) rather than ignored (``app.admin.bodies``). Litestar
describes a struct by its fields alone, and an object schema without
``additionalProperties`` allows any other: a client made from it would offer, and send,
fields the API refuses. ``ClosedBodies`` gives such a struct's schema
``additionalProperties: false``; the rest of it is Litestar's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from litestar.openapi.spec import Schema
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

if TYPE_CHECKING:
    # The type Litestar's plugin protocol hands a plugin; Litestar does not export it.
    from litestar._openapi.schema_generation import SchemaCreator


class ClosedBodies(OpenAPISchemaPlugin):
    """Describes a struct that forbids unknown fields as Litestar does, closed."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        if field_definition.is_union or not field_definition.is_subclass_of(msgspec.Struct):
            return False
        config: msgspec.structs.StructConfig = field_definition.type_.__struct_config__
        return config.forbid_unknown_fields

    def to_openapi_schema(
        self, field_definition: FieldDefinition, schema_creator: SchemaCreator
    ) -> Schema:
        litestar_own = next(
            plugin
            for plugin in schema_creator.plugins
            if plugin is not self and schema_creator.plugin_supports_field(plugin, field_definition)
        )
        schema = litestar_own.to_openapi_schema(field_definition, schema_creator)
        # The component registered under the struct's name: what every reference names.
        schema.additional_properties = False
        return schema
