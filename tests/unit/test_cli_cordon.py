"""`llmgw-cli cordon` says what the node's cordon is now: the reason it was cordoned with,
or, when nothing was recorded, the reason it already has (a cordon of a cordoned node with
the same reason, or none, changes nothing)."""

from __future__ import annotations

import json

import msgspec
import pytest

from cli.config import ConnectionFlags
from cli.nodes import cordon
from tests.support.stub_admin import StubHandler, stub_admin_api


class Cordoning(StubHandler):
    """As the admin API: a node cordoned for "fan noise", which only another, non-empty
    reason changes."""

    recorded = "fan noise"

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["content-length"])))["reason"]
        changed = bool(asked) and asked != type(self).recorded
        if changed:
            type(self).recorded = asked
        node = {"id": "gpu-1", "cordoned": True, "cordon_reason": type(self).recorded}
        answer = {"changed": changed, "node": node}
        self.answer(200, "application/json", msgspec.json.encode(answer))


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("ECC errors on GPU 3", "node gpu-1: cordoned: ECC errors on GPU 3\n"),
        ("fan noise", "node gpu-1: already cordoned: fan noise; nothing recorded\n"),
        ("", "node gpu-1: already cordoned: fan noise; nothing recorded\n"),
    ],
)
def test_a_cordon_says_the_reason_the_node_has_now(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], reason: str, said: str
) -> None:
    Cordoning.recorded = "fan noise"
    with stub_admin_api(Cordoning, monkeypatch) as url:
        code = cordon("gpu-1", reason=reason, connection=ConnectionFlags(admin_url=url))

    assert (code, capsys.readouterr().out) == (0, said)
