"""The XID table: which codes take a GPU out of service."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.gpus.xid import XID_TABLE, XidClass, classify_xid, xid_reason


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140])
def test_hardware_and_reset_needing_xids_make_the_gpu_unhealthy(code: int) -> None:
    info = classify_xid(code)

    assert info.marks_unhealthy
    assert info.classification in {XidClass.HARDWARE, XidClass.DRIVER}


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68, 109])
def test_application_faults_leave_the_gpu_healthy(code: int) -> None:
    info = classify_xid(code)

    assert info.classification is XidClass.APPLICATION
    assert not info.marks_unhealthy


def test_an_unknown_xid_defaults_to_unhealthy() -> None:
    info = classify_xid(7777)

    assert (info.code, info.classification, info.marks_unhealthy) == (
        7777,
        XidClass.UNKNOWN,
        True,
    )


def test_every_application_fault_is_healthy_and_every_entry_is_described() -> None:
    for code, info in XID_TABLE.items():
        assert info.code == code
        assert info.description
        assert info.description == info.description.strip()
        if info.classification is XidClass.APPLICATION:
            assert not info.marks_unhealthy, code


def test_reasons_name_the_code_and_its_meaning() -> None:
    assert xid_reason(79) == "XID 79: GPU has fallen off the bus"
    assert xid_reason(48) == "XID 48: double-bit ECC error"


def test_the_table_in_the_docs_says_what_the_code_does() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "gpus.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (.+?) \| (\w+) \| (\w+) \|$", docs, re.MULTILINE)

    documented = {int(code): (meaning, kind, verdict) for code, meaning, kind, verdict in rows}

    assert documented.keys() == XID_TABLE.keys()
    for code, (meaning, kind, verdict) in documented.items():
        info = XID_TABLE[code]
        assert meaning.startswith(info.description), code
        assert kind == info.classification, code
        assert verdict == ("unhealthy" if info.marks_unhealthy else "healthy"), code
