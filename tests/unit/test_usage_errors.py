"""Every program tells a mistyped command line the same way: exit 2 and one line on stderr,
``PROGRAM SUBCOMMAND: what is wrong; did you mean ...?``, naming the unknown word first,
never wrapped to the terminal, whatever the line holds shown as visible escapes.
(``test_cli_usage_errors.py`` tells llmgw-cli's, through the real program.)"""

from __future__ import annotations

import pytest
from cyclopts import App
from rich.text import Text

import agent.main
import app.main
import cli.main
import devcluster.main
from app.usage_errors import missing_command, run_program, usage_error_console
from app.usage_words import closest, finite_number, shown, whole_number


def usage_error(
    program: App, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[object, str, str]:
    """What the program exits with, prints and writes on stderr for ``argv``."""
    with pytest.raises(SystemExit) as ended:
        program(argv)
    printed = capsys.readouterr()
    return ended.value.code, printed.out, printed.err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # Beside the missing --database-url: the unknown option is what is wrong.
        (
            ["serve", "--nope"],
            "llmgw-server serve: unknown option --nope; see llmgw-server serve --help",
        ),
        (
            ["gateway", "--nope"],
            "llmgw-server gateway: unknown option --nope; see llmgw-server gateway --help",
        ),
        (
            ["migrate", "--nope"],
            "llmgw-server migrate: unknown option --nope; see llmgw-server migrate --help",
        ),
        (
            ["log", "verify", "--anchr", "1:ab"],
            "llmgw-server log verify: unknown option --anchr; did you mean --anchor?",
        ),
        (["lgo"], 'llmgw-server: unknown command "lgo"; did you mean "log"?'),
        (["--nope"], "llmgw-server: unknown option --nope; see llmgw-server --help"),
        (["log", "--nope"], "llmgw-server log: unknown option --nope; see llmgw-server log --help"),
        (["--verison"], "llmgw-server: unknown option --verison; did you mean --version?"),
        (["serve"], "llmgw-server serve: --database-url is required"),
    ],
)
def test_a_mistyped_server_command_line_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert usage_error(app.main.app, argv, capsys) == (2, "", line + "\n")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--nope"], "llmgw-agent: unknown option --nope; see llmgw-agent --help"),
        (["--nodeid", "gpu-07"], "llmgw-agent: unknown option --nodeid; did you mean --node-id?"),
        (
            ["fake-gpu", "mrk", "--gpu", "0"],
            'llmgw-agent fake-gpu: unknown command "mrk"; did you mean "mark"?',
        ),
        (
            ["fake-gpu", "--gpu", "0"],
            "llmgw-agent fake-gpu: unknown option --gpu; see llmgw-agent fake-gpu --help",
        ),
        (["fake-gpu", "clear"], "llmgw-agent fake-gpu clear: --gpu is required"),
        (["--state-dir", ""], "llmgw-agent: --state-dir cannot be empty"),
        (["--cert= "], "llmgw-agent: --cert cannot be empty"),
        (
            ["stop-engines", "--state-dir", "/var/lib/a", "--state-dir", ""],
            "llmgw-agent stop-engines: --state-dir cannot be empty",
        ),
    ],
)
def test_a_mistyped_agent_command_line_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert usage_error(agent.main.app, argv, capsys) == (2, "", line + "\n")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--nope"], "llmgw-dev: unknown option --nope; see llmgw-dev --help"),
        (["--replicsa", "3"], "llmgw-dev: unknown option --replicsa; did you mean --replicas?"),
    ],
)
def test_a_mistyped_dev_command_line_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert usage_error(devcluster.main.app, argv, capsys) == (2, "", line + "\n")


@pytest.mark.parametrize(
    ("program", "argv", "line"),
    [
        (
            cli.main.app,
            ["keys"],
            "llmgw-cli keys: a command is required: create, list, revoke; see llmgw-cli keys "
            "--help",
        ),
        (
            cli.main.app,
            ["history"],
            "llmgw-cli history: a command is required: replica, node, model, key, certificate; see "
            "llmgw-cli history --help",
        ),
        (
            cli.main.app,
            ["rollout"],
            "llmgw-cli rollout: a command is required: status, pause, resume, undo, history; "
            "see llmgw-cli rollout --help",
        ),
        (
            app.main.app,
            ["log"],
            "llmgw-server log: a command is required: verify, head; see llmgw-server log --help",
        ),
        (
            agent.main.app,
            ["fake-gpu"],
            "llmgw-agent fake-gpu: a command is required: mark, clear, use; see llmgw-agent "
            "fake-gpu --help",
        ),
    ],
)
def test_a_command_line_that_stops_at_a_group_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    program: App,
    argv: list[str],
    line: str,
) -> None:
    # Before, the group's help went to stdout with exit 0: `llmgw-cli keys $ACTION`, with
    # $ACTION unset, looked to a script like a command that worked.
    monkeypatch.setattr("sys.argv", [str(program.name[0]), *argv])
    with pytest.raises(SystemExit) as ended:
        run_program(program)

    assert (ended.value.code, *capsys.readouterr()) == (2, "", line + "\n")


@pytest.mark.parametrize(
    ("program", "argv"),
    [
        (cli.main.app, ["models"]),  # a group that lists by itself
        (cli.main.app, ["keys", "list"]),
        (cli.main.app, ["keys", "--help"]),
        (cli.main.app, ["--version"]),
        (cli.main.app, ["keys", "lst"]),  # told by cyclopts, as a mistyped command
        (devcluster.main.app, []),
        (agent.main.app, []),
    ],
)
def test_a_command_line_that_names_a_command_is_left_to_it(program: App, argv: list[str]) -> None:
    assert missing_command(program, argv) is None


@pytest.mark.parametrize("empty", ["", " "])
def test_a_dev_state_dir_given_empty_is_bad_usage_not_the_current_directory(
    capsys: pytest.CaptureFixture[str], empty: str
) -> None:
    """``Path("")`` is the current directory: a whole cluster's state made wherever the
    shell stood. Only parsed here, so that a regression ends the test rather than starting
    that cluster."""
    with pytest.raises(SystemExit) as ended:
        devcluster.main.app.parse_args(["--state-dir", empty])

    assert (ended.value.code, capsys.readouterr().err) == (
        2,
        "llmgw-dev: --state-dir is empty: give a path, or leave the flag out\n",
    )


def test_what_the_command_line_held_reaches_the_terminal_as_visible_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An option that would set the terminal's title, or clear it, is shown, not obeyed."""
    code, _, err = usage_error(app.main.app, ["serve", "--\x1b]0;owned\x07\r\u202e"], capsys)

    assert (code, err) == (
        2,
        "llmgw-server serve: unknown option --\\x1b]0;owned\\x07\\r\\u202e; "
        "see llmgw-server serve --help\n",
    )


@pytest.mark.parametrize(
    ("word", "guess"),
    [
        ("-x", None),  # one edit from -h, as every one-letter option is: no guess
        ("x", None),
        ("--x", None),
        ("--h", "--help"),
        ("-port", "--port"),
        ("--prot", "--port"),
        ("--max-num-seq", "--max-num-seqs"),
    ],
)
def test_a_guess_keeps_a_letter_of_the_word(word: str, guess: str | None) -> None:
    assert closest(word, ["--help", "-h", "--port", "--max-num-seqs", "y"]) == guess


def test_printable_text_is_shown_as_it_is() -> None:
    assert shown("模型 ünïcödé ✓ C:\\x1b") == "模型 ünïcödé ✓ C:\\x1b"
    assert shown("a\nb\tc\x9b") == "a\\nb\\tc\\x9b"


def test_the_usage_error_console_never_wraps_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    line = "llmgw-agent: unknown option --nope; see llmgw-agent --help"

    usage_error_console().print(Text(line))

    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize(
    ("text", "number"), [("3", 3), (" 3 ", 3), ("+3", 3), ("-4", -4), ("007", 7), ("-0", 0)]
)
def test_decimal_digits_are_a_whole_number(text: str, number: int) -> None:
    assert whole_number(text) == number


@pytest.mark.parametrize(
    "text",
    [
        "2.5",
        "0.6",
        "1e3",
        "0x10",
        "1_0",
        "\u0663",
        "\uff13",
        "",
        "2,5",
        "1" * 5000,
        "+",
        "3 4",
        "\u06633",
        "3\n4",
    ],
)
def test_anything_else_is_not_a_whole_number(text: str) -> None:
    assert whole_number(text) is None


@pytest.mark.parametrize(
    ("text", "number"),
    [("2.5", 2.5), (" 3 ", 3.0), ("-4", -4.0), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0)],
)
def test_a_decimal_number_is_a_finite_number(text: str, number: float) -> None:
    assert finite_number(text) == number


@pytest.mark.parametrize(
    "text",
    ["nan", "inf", "-inf", "Infinity", "1e400", "-1e400", "1_0", "\u0663", "0x10", "", ".", "1e"],
)
def test_anything_else_is_not_a_finite_number(text: str) -> None:
    assert finite_number(text) is None
