"""What an operator types is checked before llmgw-cli sends anything: a name or id that
cannot be one path segment, a fraction where a count belongs, a spec file with a number
JSON cannot carry. Each is refused with one line naming what is wrong, and no request is
made: the admin URL here has nobody listening, so a request would fail differently."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cyclopts import App, Token, validators
from cyclopts.argument import Argument

from app.usage_words import whole_number as program_whole_number
from cli.arguments import (
    ArgumentRefused,
    NumberWithin,
    WholeNumberWithin,
    finite_number,
    whole_number,
)
from cli.main import app
from cli.spec_file import SpecFileError, read_specs
from devcluster.processes import program
from tests.support.ports import free_port

CLI = program("llmgw-cli")


def run_cli(*argv: str) -> tuple[int, str, str]:
    environment = os.environ | {
        "COLUMNS": "200",
        "TERM": "dumb",
        "LLMGW_ADMIN_URL": f"http://127.0.0.1:{free_port()}",
    }
    done = subprocess.run(
        [CLI, *argv], capture_output=True, text=True, env=environment, timeout=60, check=False
    )
    return done.returncode, done.stdout, done.stderr


# -- a name or id in a request path ------------------------------------------------------

NAMED = [
    (("autoscale", "{}", "--off"), "autoscale", "the model name"),
    (("autoscale", "{}", "--max", "2"), "autoscale", "the model name"),
    (("model", "{}"), "model", "the model name"),
    (("scale", "{}", "2"), "scale", "the model name"),
    (("remove", "{}"), "remove", "the model name"),
    (("explain-placement", "{}"), "explain-placement", "the model name"),
    (("rollout", "status", "{}"), "rollout status", "the model name"),
    (("rollout", "pause", "{}"), "rollout pause", "the model name"),
    (("rollout", "history", "{}"), "rollout history", "the model name"),
    (("node", "{}"), "node", "the node id"),
    (("cordon", "{}"), "cordon", "the node id"),
    (("uncordon", "{}"), "uncordon", "the node id"),
    (("drain", "{}"), "drain", "the node id"),
    (("drain", "--replica", "{}"), "drain", "the replica id"),
    (("drain-progress", "{}"), "drain-progress", "the drain id"),
    (("replica", "{}"), "replica", "the replica id"),
    (("history", "model", "{}"), "history model", "the model name"),
    (("history", "key", "{}"), "history key", "the key prefix or name"),
    (("bench", "--replica", "{}", "--slo", "ttft_p95=1s"), "bench", "--replica"),
    # Sent, `bench --model ""` asked an engine that lists no models for the model "".
    (
        ("bench", "--url", "http://127.0.0.1:1", "--model", "{}", "--slo", "ttft_p95=1s"),
        "bench",
        "--model",
    ),
    # Sent, `replicas --model ""` listed the replicas of a model that cannot exist: none,
    # with exit 0; the others were refused by the API, with exit 1.
    (("replicas", "--model", "{}"), "replicas", "--model"),
    (("replicas", "--node", "{}"), "replicas", "--node"),
    (("keys", "create", "--name", "{}", "--models", "*"), "keys create", "--name"),
    (("cert", "revoke", "--node", "{}", "--reason", "retired"), "cert revoke", "--node"),
    (("cert", "revoke", "--serial", "{}", "--reason", "lost"), "cert revoke", "--serial"),
    # Path("") is the current directory: each of these read or wrote there.
    (("cert", "node", "gpu-1", "--out", "{}"), "cert node", "--out"),
    (("cert", "show", "{}"), "cert show", "FILE"),
    (("cert", "list", "--dir", "{}", "--offline"), "cert list", "--dir"),
    # These said `Invalid value "." for FILE ... "." is a directory`: not what was typed.
    (("models", "apply", "{}"), "models apply", "FILE"),
    (("explain-placement", "--spec", "{}"), "explain-placement", "--spec"),
    (
        ("bench", "--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s", "--report-dir", "{}"),
        "bench",
        "--report-dir",
    ),
]


CASES = [(*named, "") for named in NAMED] + [(*named, " \t") for named in NAMED[:3]]


@pytest.mark.parametrize(
    ("argv", "command", "what", "value"),
    CASES,
    ids=[" ".join(case[0]).replace("{}", repr(case[3])) for case in CASES],
)
def test_an_empty_name_is_bad_usage_and_nothing_is_sent(
    argv: tuple[str, ...], command: str, what: str, value: str
) -> None:
    # Sent, `autoscale "" --off` was DELETE /admin/v1/models//autoscale: the model named
    # "autoscale" was removed.
    filled = [value if word == "{}" else word for word in argv]

    assert run_cli(*filled) == (2, "", f"llmgw-cli {command}: {what} cannot be empty\n")


@pytest.mark.parametrize(
    ("argv", "command"),
    [(("remove", "x/autoscale"), "remove"), (("autoscale", "x/y", "--off"), "autoscale")],
)
def test_a_name_holding_a_slash_is_bad_usage(argv: tuple[str, ...], command: str) -> None:
    name = argv[1]

    assert run_cli(*argv) == (
        2,
        "",
        f"llmgw-cli {command}: the model name cannot hold a '/': {name!r}\n",
    )


@pytest.mark.parametrize(
    ("argv", "command", "what"),
    [
        (("history", "replica", ".."), "history replica", "the replica id"),
        (("history", "model", "."), "history model", "the model name"),
        (("autoscale", "..", "--off"), "autoscale", "the model name"),
    ],
)
def test_a_dot_or_two_for_a_name_is_bad_usage(
    argv: tuple[str, ...], command: str, what: str
) -> None:
    # Sent, `history replica ..` asked for /admin/v1/history: "no such path", exit 1.
    name = next(word for word in argv[1:] if word.strip(".") == "")

    assert run_cli(*argv) == (
        2,
        "",
        f"llmgw-cli {command}: {what} cannot be {name!r}: a URL reads it as a step up its path\n",
    )


def test_a_spec_file_with_an_empty_name_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "llama.yaml"
    spec.write_text('name: ""\ncommand: vllm serve x --port {port}\n')

    assert run_cli("models", "apply", str(spec)) == (
        1,
        "",
        f"llmgw-cli models apply: {spec}: name cannot be empty\n",
    )


def test_a_spec_file_that_declares_a_model_twice_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    # Sent, each spec was applied in turn: two revisions and a rollout between them, where
    # --dry-run had said of both "new, would be declared at revision 1".
    spec = tmp_path / "models.yaml"
    spec.write_text(
        "name: llama\ncommand: vllm serve a --port {port}\n---\n"
        "name: qwen\ncommand: vllm serve b --port {port}\n---\n"
        "name: llama\ncommand: vllm serve c --port {port}\n"
    )

    assert run_cli("models", "apply", str(spec)) == (
        1,
        "",
        f"llmgw-cli models apply: spec 3 in {spec}: model llama is declared by spec 1 "
        "already; a file declares each model once\n",
    )


# -- a count is a whole number -----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ("autoscale", "m", "--max-step", "0.6"),
            "autoscale: --max-step must be a whole number, got 0.6",
        ),
        (("autoscale", "m", "--max", "2.5"), "autoscale: --max must be a whole number, got 2.5"),
        (("autoscale", "m", "--min=1.5"), "autoscale: --min must be a whole number, got 1.5"),
        (("scale", "m", "2.5"), "scale: REPLICAS must be a whole number, got 2.5"),
        (("events", "--last", "1e3"), "events: --last must be a whole number, got 1e3"),
        (
            ("history", "node", "n", "--limit", "nan"),
            "history node: --limit must be a whole number, got nan",
        ),
        (
            ("keys", "create", "--name", "k", "--models", "m", "--rpm", "0.5"),
            "keys create: --rpm must be a whole number, got 0.5",
        ),
        (
            ("cert", "init-ca", "--days", "1.5"),
            "cert init-ca: --days must be a whole number, got 1.5",
        ),
    ],
)
def test_a_fraction_where_a_count_belongs_is_bad_usage(argv: tuple[str, ...], line: str) -> None:
    # cyclopts rounded them: --max-step 0.6 was sent as 1, --max 2.5 as 2.
    assert run_cli(*argv) == (2, "", f"llmgw-cli {line}\n")


@pytest.mark.parametrize(("text", "number"), [("4", 4), ("-3", -3), ("+2", 2), (" 30 ", 30)])
def test_a_whole_number_may_be_written_with_a_sign(text: str, number: int) -> None:
    assert whole_number(int, [Token(value=text)]) == number


@pytest.mark.parametrize(
    "text", ["2.5", "0.6", "4.0", "30.", "1e3", "inf", "nan", "0x10", "1_0", "\u0663", "", "two"]
)
def test_anything_else_is_not_a_whole_number(text: str) -> None:
    with pytest.raises(ArgumentRefused, match=f"must be a whole number, got {text}$"):
        whole_number(int, [Token(value=text)])


@pytest.mark.parametrize(
    "text",
    [
        *("4", " 4 ", "-3", "+2", "007", "4.0", "30.", "4.00", "2.5", "1e3", "0x10", "1_0"),
        *("\u0663", "", " ", "two", "inf", "nan", "4\n", "--4", "4 4", "9" * 5000),
    ],
)
def test_the_cli_takes_for_a_whole_number_what_the_other_programs_do(text: str) -> None:
    # The CLI cannot import app.usage_words: its check is its own, and must agree.
    expected = program_whole_number(text)
    try:
        taken: int | None = whole_number(int, [Token(value=text)])
    except ArgumentRefused:
        taken = None

    assert taken == expected


def every_argument(command: App, chain: tuple[str, ...] = ()) -> list[tuple[str, Argument]]:
    """Every argument and option of ``command`` and its subcommands, each named after the
    command it belongs to (``rollout history --limit``)."""
    found: list[tuple[str, Argument]] = []
    for name in command:
        sub = command[name]
        if not name.startswith("-") and sub is not command:
            found += every_argument(sub, (*chain, name))
    try:
        arguments = command.assemble_argument_collection()
    except ValueError:  # a group without a default command has no arguments of its own
        return found
    found += [(f"{' '.join(chain)} {argument.name}", argument) for argument in arguments]
    return found


def typed_arguments(command: App, kind: str) -> list[tuple[str, object]]:
    """Every argument of ``command`` and its subcommands whose type holds ``kind`` (``int``,
    ``float``), with its converter."""
    return [
        (name, argument.parameter.converter)
        for name, argument in every_argument(command)
        if argument.parse and kind in str(argument.hint).replace(f"<class '{kind}'>", kind)
    ]


def test_every_count_of_every_command_goes_through_the_whole_number_converter() -> None:
    counts = dict(typed_arguments(app, "int"))

    assert len(counts) >= 20, counts  # scale, autoscale, events, history, keys, cert, bench
    # A bounded count (``WholeNumberWithin``) is checked by ``whole_number`` first.
    assert {
        name
        for name, converter in counts.items()
        if converter is not whole_number and not isinstance(converter, WholeNumberWithin)
    } == set()


def test_no_argument_of_any_command_is_bounded_in_cyclopts_words() -> None:
    """A bound belongs in ``WholeNumberWithin`` or ``NumberWithin``: cyclopts' own
    ``validators.Number`` refuses in its words (``Invalid value "10001" for REPLICAS. Must be
    <= 10000.``), not in the one line every other refused value of the CLI is told in."""
    arguments = every_argument(app)

    assert len(arguments) >= 100, len(arguments)
    assert [
        name
        for name, argument in arguments
        if any(isinstance(check, validators.Number) for check in argument.parameter.validator or ())
    ] == []


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("drain", "gpu-1", "--grace", "0"), "drain: --grace must be above 0, got 0"),
        (
            ("rollout", "status", "m", "--wait", "--timeout", "-1"),
            "rollout status: --timeout must be above 0, got -1",
        ),
        (
            ("rollout", "history", "m", "--limit", "101"),
            "rollout history: --limit must be from 1 to 100, got 101",
        ),
        (
            ("keys", "create", "--name", "ci", "--models", "m", "--rpm", "0"),
            "keys create: --rpm must be from 1 to 2147483647, got 0",
        ),
        (
            ("keys", "create", "--name", "ci", "--models", "m", "--tpm", "2147483648"),
            "keys create: --tpm must be from 1 to 2147483647, got 2147483648",
        ),
        (
            ("bench", "--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s", "--requests", "0"),
            "bench: --requests must be at least 1, got 0",
        ),
        (
            ("events", "--last", "-1"),
            "events: --last must be from 0 to 9223372036854775807, got -1",
        ),
    ],
)
def test_a_number_past_its_bounds_is_refused_in_one_line_naming_them(
    argv: tuple[str, ...], line: str
) -> None:
    # Before, cyclopts said it its own way: Invalid value "0" for --grace. Must be > 0.
    assert run_cli(*argv) == (2, "", f"llmgw-cli {line}\n")


@pytest.mark.parametrize(
    ("converter", "text", "refusal"),
    [
        (WholeNumberWithin(1), "0", "must be at least 1, got 0"),
        (WholeNumberWithin(0, 5), "6", "must be from 0 to 5, got 6"),
        (NumberWithin(0, above_low=True), "0", "must be above 0, got 0"),
        (NumberWithin(0.5), "0.25", "must be at least 0.5, got 0.25"),
        (NumberWithin(0, 1, above_low=True), "2", "must be above 0 and at most 1, got 2"),
    ],
)
def test_a_bound_open_above_is_told_as_one(
    converter: WholeNumberWithin | NumberWithin, text: str, refusal: str
) -> None:
    with pytest.raises(ArgumentRefused, match=f"^{refusal}$"):
        converter(float, [Token(value=text)])


@pytest.mark.parametrize(
    ("converter", "text", "number"),
    [
        (WholeNumberWithin(1), str(2**70), 2**70),
        (NumberWithin(0, above_low=True), "1e300", 1e300),
        (NumberWithin(0.5), "0.5", 0.5),
    ],
)
def test_a_bound_open_above_takes_any_number_from_its_low(
    converter: WholeNumberWithin | NumberWithin, text: str, number: float
) -> None:
    assert converter(float, [Token(value=text)]) == number


# -- a number is finite -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("drain", "gpu-1", "--grace", "inf"), "drain: --grace must be a finite number, got inf"),
        (
            ("autoscale", "m", "--up-window", "nan"),
            "autoscale: --up-window must be a finite number, got nan",
        ),
        (
            ("rollout", "status", "m", "--wait", "--timeout", "Infinity"),
            "rollout status: --timeout must be a finite number, got Infinity",
        ),
    ],
)
def test_infinity_or_nan_where_a_number_belongs_is_bad_usage(
    argv: tuple[str, ...], line: str
) -> None:
    # Sent, `drain --grace inf` was {"grace_s": null}: the default grace, not an endless one.
    assert run_cli(*argv) == (2, "", f"llmgw-cli {line}\n")


@pytest.mark.parametrize(("text", "number"), [("4", 4.0), ("-0.5", -0.5), ("1e3", 1000.0)])
def test_a_finite_number_is_taken_as_written(text: str, number: float) -> None:
    assert finite_number(float, [Token(value=text)]) == number


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("inf", "must be a finite number, got inf"),
        ("-Infinity", "must be a finite number, got -Infinity"),
        ("nan", "must be a finite number, got nan"),
        ("ten", "must be a number, got ten"),
    ],
)
def test_anything_else_is_not_a_finite_number(text: str, refusal: str) -> None:
    with pytest.raises(ArgumentRefused, match=f"^{refusal}$"):
        finite_number(float, [Token(value=text)])


def test_every_number_of_every_command_goes_through_the_finite_number_converter() -> None:
    numbers = dict(typed_arguments(app, "float"))

    assert len(numbers) >= 9, numbers  # autoscale's seven, drain --grace, rollout --timeout
    # A bounded number (``NumberWithin``) is checked by ``finite_number`` first.
    assert {
        name
        for name, converter in numbers.items()
        if converter is not finite_number and not isinstance(converter, NumberWithin)
    } == set()


# -- a spec file's numbers are finite ----------------------------------------------------


@pytest.mark.parametrize(
    ("file", "text", "field", "value"),
    [
        (
            "llama.yaml",
            "name: llama\ncommand: x\nautoscale: {max: 4, target: .inf, idle_to_zero_s: .nan}\n",
            "autoscale.target",
            "inf",
        ),
        (
            "llama.yaml",
            "name: llama\ncommand: x\nautoscale: {max: 4, idle_to_zero_s: .NaN}\n",
            "autoscale.idle_to_zero_s",
            "nan",
        ),
        (
            "llama.json",
            '{"name": "llama", "command": "x", "gpu_memory_gib": -Infinity}',
            "gpu_memory_gib",
            "-inf",
        ),
        (
            "llama.json",
            '[{"name": "qwen", "command": "x"}, '
            '{"name": "llama", "command": "x", "rollout": {"steps": [{"hold_s": NaN}]}}]',
            "rollout.steps[0].hold_s",
            "nan",
        ),
    ],
)
def test_a_spec_with_infinity_or_nan_is_refused_naming_file_model_and_field(
    tmp_path: Path, file: str, text: str, field: str, value: str
) -> None:
    # Sent, msgspec wrote them as null, which the API reads as "the default": target 4.
    spec = tmp_path / file
    spec.write_text(text)

    expected = f"{spec} (model llama): {field} must be a finite number, not {value}"
    with pytest.raises(SpecFileError) as refused:
        read_specs(spec)
    assert str(refused.value) == expected
    assert run_cli("models", "apply", str(spec)) == (1, "", f"llmgw-cli models apply: {expected}\n")


# -- bench's concurrency -------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--start-concurrency", "--max-concurrency"])
def test_bench_refuses_a_concurrency_beyond_what_the_api_records(flag: str) -> None:
    """Before, --start-concurrency 1000000000 (a slip of three zeros) started a billion
    clients at once, each a task and a connection, until memory ran out; a capacity above
    100000 could not be applied anyway."""
    extra = ("--max-concurrency", "1000000000") if flag == "--start-concurrency" else ()
    code, _, stderr = run_cli(
        *("bench", "--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s"),
        *(flag, "1000000000", *extra),
    )

    assert code == 2, stderr
    assert stderr == f"llmgw-cli bench: {flag} must be from 1 to 100000, got 1000000000\n"


def test_bench_climbs_no_higher_than_the_capacity_the_api_records() -> None:
    from app.domain.tuning import MAX_BENCH_CAPACITY
    from cli.bench.command import MAX_CONCURRENCY

    assert MAX_CONCURRENCY == MAX_BENCH_CAPACITY


# -- bench's prompt and answer lengths -----------------------------------------------------


@pytest.mark.parametrize("flag", ["--input-tokens", "--output-tokens"])
def test_bench_refuses_a_length_beyond_any_context_window(flag: str) -> None:
    """Before, --input-tokens 1000000000 (a slip of a few zeros) was taken: each prompt of a
    billion words was to be built in memory and sent whole."""
    code, _, stderr = run_cli(
        *("bench", "--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s"),
        *(flag, "1000000000"),
    )

    assert code == 2, stderr
    assert stderr == (f"llmgw-cli bench: {flag} must be from 1 to 1048576, got 1000000000\n")


def test_a_ca_directory_given_empty_is_bad_usage_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, `cert init-ca --dir "$CA_DIR"` with the variable unset created the CA (its
    # private key too) in the directory the command ran in.
    monkeypatch.chdir(tmp_path)

    with pytest.raises(SystemExit) as ended:
        app(["cert", "init-ca", "--dir", ""])

    assert ended.value.code == 2
    assert capsys.readouterr().err == "llmgw-cli cert init-ca: --dir cannot be empty\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("under", [False, True], ids=["a-file", "under-a-file"])
def test_bench_refuses_a_report_dir_it_cannot_make_before_the_climb(
    tmp_path: Path, under: bool
) -> None:
    # Before, the report was first written after the whole climb, minutes later, and a file
    # in the way ended bench in a traceback (FileExistsError), its levels unreported.
    in_the_way = tmp_path / "bench.json"
    in_the_way.write_text("")
    report_dir = in_the_way / "run-1" if under else in_the_way

    code, _, stderr = run_cli(
        *("bench", "--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s"),
        *("--report-dir", str(report_dir)),
    )

    assert (code, stderr) == (
        2,
        f"llmgw-cli bench: --report-dir {report_dir}: {in_the_way} is not a directory\n",
    )


@pytest.mark.parametrize("name", ["bench.json", "bench.png"])
def test_bench_refuses_a_report_dir_whose_report_file_is_a_fifo_before_the_climb(
    tmp_path: Path, name: str
) -> None:
    # Before, the climb ran, and writing the report then waited on the FIFO for ever.
    os.mkfifo(tmp_path / name)

    code, _, stderr = run_cli(
        *("bench", "--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s"),
        *("--report-dir", str(tmp_path)),
    )

    assert (code, stderr) == (
        2,
        f"llmgw-cli bench: --report-dir {tmp_path}: {tmp_path / name}, which bench writes its "
        "report to, is not a regular file but a named pipe (FIFO)\n",
    )
