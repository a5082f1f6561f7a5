"""A table written to a pipe or a file (a script's ``| grep``, cron's mail, a CI log) is
laid out whole, as ``--output wide`` lays it out: no column left out, no value folded over
lines, so a ``grep`` finds each row whole on one line. ``$COLUMNS`` still asks for a width,
and a terminal keeps being fitted (``tests/unit/test_cli_tables.py``)."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from cli.render import stdout_has_no_width
from devcluster.processes import program
from tests.support.operator_cli import clean_environment
from tests.support.stub_admin import StubHandler, listed_key, stub_admin_api

CLI = program("llmgw-cli")
MODELS = ["llama-3.1-70b-instruct", "qwen2.5-72b-instruct", "mistral-large-2411"]
KEYS = [
    listed_key(
        n,
        name=f"nightly-evaluation-pipeline-{n}",
        models=MODELS,
        rpm=600,
        tpm=2_000_000,
        created_by="ci-deployer@llmgw.internal",
    )
    for n in range(3)
]


class Listing(StubHandler):
    """Three keys, one page."""

    def do_GET(self) -> None:
        after = parse_qs(urlsplit(self.path).query).get("after")
        self.answer(200, "application/json", msgspec.json.encode([] if after else KEYS))


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with stub_admin_api(Listing, monkeypatch) as url:
        yield url


def keys_list(admin_url: str, **environment: str) -> str:
    """``llmgw-cli keys list`` with nothing but pipes and /dev/null around it, as from cron
    (no ``COLUMNS`` unless given: pytest-xdist's workers set one): its stdout."""
    inherited = {name: value for name, value in clean_environment().items() if name != "COLUMNS"}
    done = subprocess.run(
        [CLI, "keys", "list"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=inherited | {"LLMGW_CONFIG": "/dev/null", "LLMGW_ADMIN_URL": admin_url, **environment},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_piped_table_has_every_column_and_each_row_on_one_line(admin_url: str) -> None:
    # Before, with no terminal anywhere, the table was fitted to 80 columns: the expiry
    # and revocation columns folded into pieces, names and models cut over several lines,
    # and a grep for a key's name found no line with its prefix.
    out = keys_list(admin_url)

    assert "left out to fit" not in out
    header = next(line for line in out.splitlines() if "prefix" in line)
    for title in ("name", "models", "rpm", "tpm", "expires (UTC)", "created (UTC)"):
        assert title in header
    for key in KEYS:
        (row,) = [line for line in out.splitlines() if str(key["name"]) in line]
        assert str(key["prefix"]) in row
        assert ", ".join(MODELS) in row or ",".join(MODELS) in row
        assert "ci-deployer@llmgw.internal" in row


def test_help_written_to_a_pipe_keeps_every_example_whole() -> None:
    # Laying out every line of a piped console unfolded cropped what rich draws in boxes
    # of the console's width: --help's examples lost their ends ("--tpm 1" for
    # "--tpm 100000").
    inherited = {name: value for name, value in clean_environment().items() if name != "COLUMNS"}
    done = subprocess.run(
        [CLI, "keys", "create", "--help"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=inherited,
    )

    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert "--rpm 60 --tpm 100000" in flat
    assert "--expires-at 2027-01-31T00:00:00Z" in flat


def test_columns_given_still_fits_the_table_to_them(admin_url: str) -> None:
    out = keys_list(admin_url, COLUMNS="80")

    assert not any(
        str(key["name"]) in line and ", ".join(MODELS) in line
        for key in KEYS
        for line in out.splitlines()
    )


@pytest.mark.parametrize(
    ("columns", "no_width"), [("", True), ("0", True), ("abc", True), ("132", False)]
)
def test_only_a_positive_whole_columns_gives_a_pipe_a_width(
    monkeypatch: pytest.MonkeyPatch, columns: str, no_width: bool
) -> None:
    monkeypatch.setattr("sys.stdout", io.StringIO())  # no terminal

    assert stdout_has_no_width({"COLUMNS": columns}) is no_width
