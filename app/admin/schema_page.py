"""What the admin API serves under ``/admin/v1/schema``: the OpenAPI schema as JSON and YAML,
and at the root a short page that links to them.

Litestar's default pages (Swagger UI, ReDoc, RapiDoc, Stoplight Elements) load their
scripts from a CDN, so on an air-gapped site, as GPU fleets often are, each was a blank
page; they would also run a third party's scripts in the admin API's origin. The page here
is self-contained: it names no host but the one it was asked on, and says how to view the
schema offline.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

import yaml
from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin, OpenAPIRenderPlugin, YamlRenderPlugin

SCHEMA_PATH = "/admin/v1/schema"
JSON_PATH = f"{SCHEMA_PATH}/openapi.json"
YAML_PATH = f"{SCHEMA_PATH}/openapi.yaml"


class SchemaLinksPage(OpenAPIRenderPlugin):
    """The page at the schema's root: links to the schema files, nothing loaded."""

    def __init__(self) -> None:
        super().__init__(path="/")

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        info = openapi_schema.get("info", {})
        title = escape(f"{info.get('title', 'API')} {info.get('version', '')}".strip())
        own_url = escape(str(request.base_url).rstrip("/"))
        return f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}: OpenAPI schema</title></head>
<body>
<h1>{title}: OpenAPI schema</h1>
<p>The schema is <a href="{JSON_PATH}">{JSON_PATH}</a>
(as YAML: <a href="{YAML_PATH}">{YAML_PATH}</a>).</p>
<p>This server loads nothing from other hosts, so it serves no interactive viewer. Open the
file in an OpenAPI viewer or editor you have installed, or read it with
<code>curl -s {own_url}{JSON_PATH} | python3 -m json.tool</code>.</p>
<p>Every request but the schema, <code>/healthz</code>, <code>/readyz</code> and
<code>/metrics</code> needs an admin token (<code>Authorization: Bearer TOKEN</code>) or an
operator certificate.</p>
</body>
</html>
""".encode()


class PlainYaml(YamlRenderPlugin):
    """The JSON schema as YAML that any YAML reader loads. Litestar's own dumps some
    defaults with Python's tags (``!!python/tuple``), which a safe loader, and every YAML
    tool that is not Python's, refuses."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        document = json.loads(self.render_json(request, openapi_schema))
        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()


def schema_pages() -> list[OpenAPIRenderPlugin]:
    """The root page, then ``openapi.json`` and ``openapi.yaml`` (also ``openapi.yml``)."""
    return [SchemaLinksPage(), JsonRenderPlugin(), PlainYaml()]
