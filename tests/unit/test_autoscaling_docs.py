"""docs/autoscaling.md cannot rot: every spec it shows is one the control plane accepts,
with a policy, and its table of policy fields has every field with its real default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from app.domain.model_spec import AutoscalePolicy, ModelSpec, validate_spec

PAGE = Path(__file__).resolve().parents[2] / "docs" / "autoscaling.md"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)
FIELD_ROW = re.compile(r"^\| `(?P<field>\w+)` \| (?P<default>[^|]+) \|", re.MULTILINE)


def documented_specs() -> list[dict[str, Any]]:
    specs = [yaml.safe_load(block) for block in YAML_BLOCK.findall(PAGE.read_text())]
    assert specs, f"no yaml block in {PAGE}"
    return specs


SPECS = documented_specs()


@pytest.mark.parametrize("document", SPECS, ids=[spec["name"] for spec in SPECS])
def test_a_documented_spec_is_accepted_with_its_policy(document: dict[str, Any]) -> None:
    spec = msgspec.convert(document, ModelSpec)

    assert validate_spec(spec) == []
    assert spec.autoscale is not None


def test_the_table_of_policy_fields_has_each_field_with_its_default() -> None:
    documented = {m["field"]: m["default"].strip() for m in FIELD_ROW.finditer(PAGE.read_text())}

    for field in msgspec.structs.fields(AutoscalePolicy):
        assert field.encode_name in documented, field.encode_name
        shown = "none" if field.default is None else f"{field.default:g}"
        assert documented[field.encode_name] == shown, field.encode_name
