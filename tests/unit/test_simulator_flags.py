"""The simulator's command line: flags, their ``LLMGW_SIM_<FLAG>`` variables, bad usage
told in one line as every program tells it, and a start that stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import FrameType

import pytest

from agent.simulator.flags import (
    FLAGS,
    UsageError,
    build_parser,
    defaults_from_environment,
    served_model,
)
from agent.simulator.flags import parse as parse_settings
from devcluster.processes import program


def parse(argv: list[str], environ: dict[str, str]) -> dict[str, object]:
    return vars(parse_settings(argv, environ))


def served(argv: list[str], environ: dict[str, str]) -> str:
    return served_model(parse_settings(argv, environ))


def test_a_variable_gives_a_flag_its_value_and_the_command_line_wins() -> None:
    environ = {"LLMGW_SIM_MAX_NUM_SEQS": "3", "LLMGW_SIM_MODEL": "env-model"}

    from_environment = parse([], environ)
    from_both = parse(["--max-num-seqs", "5", "--model", "flag-model"], environ)

    assert (from_environment["max_num_seqs"], from_environment["model"]) == (3, "env-model")
    assert (from_both["max_num_seqs"], from_both["model"]) == (5, "flag-model")


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("1", True), ("Off", False)])
def test_a_switch_reads_true_and_false_from_its_variable(text: str, expected: bool) -> None:
    assert parse([], {"LLMGW_SIM_INSTANT": text})["instant"] is expected


def test_a_switch_on_the_command_line_overrides_its_variable() -> None:
    assert parse(["--no-instant"], {"LLMGW_SIM_INSTANT": "true"})["instant"] is False


@pytest.mark.parametrize(
    ("variable", "text", "said"),
    [
        ("LLMGW_SIM_INSTANT", "maybe", "LLMGW_SIM_INSTANT='maybe': expected true or false"),
        ("LLMGW_SIM_PORT", "80a", "LLMGW_SIM_PORT='80a'"),
        ("LLMGW_SIM_PROFILE", "tgi", "expected one of vllm, sglang, llamacpp"),
    ],
)
def test_a_variable_that_does_not_parse_is_named(variable: str, text: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        defaults_from_environment({variable: text})


def test_the_simulator_starts_without_rich_or_cyclopts() -> None:
    """Two fifths of its start were these imports; an engine's start is what the agent,
    the gateway and the autoscaler wait for."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(n for n in ('rich', 'cyclopts') if sys.modules.get(n))))\n"  # noqa: E501
        "sys.argv = ['llmgw-sim-engine', '--help']\n"
        "from agent.simulator.main import main\n"
        "main()\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )

    assert shown.returncode == 0, shown.stderr
    assert "LLMGW_SIM_<FLAG>" in shown.stdout
    assert shown.stdout.rstrip().endswith("[]")


def test_the_served_model_name_variable_names_the_model_as_the_flag_does() -> None:
    assert served([], {"LLMGW_SIM_SERVED_MODEL_NAME": "env-model"}) == "env-model"


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "meta-llama/Llama-3.1-8B", "--served-model-name", "llama"],
        ["--served-model-name", "llama", "--model", "meta-llama/Llama-3.1-8B"],
    ],
)
def test_the_served_model_name_is_the_name_served_whatever_the_order_of_the_flags(
    argv: list[str],
) -> None:
    """As vLLM: --model is the weights, --served-model-name the name clients use. They were
    one flag under two names, so whichever came last won."""
    assert served(argv, {}) == "llama"


def test_without_a_served_model_name_the_model_is_served_under_its_own_name() -> None:
    assert served(["--model", "meta-llama/Llama-3.1-8B"], {}) == "meta-llama/Llama-3.1-8B"
    assert served([], {}) == "sim-model"


def test_both_variables_set_serve_the_served_model_name_as_both_flags_do() -> None:
    both = {"LLMGW_SIM_MODEL": "a", "LLMGW_SIM_SERVED_MODEL_NAME": "b"}

    assert served([], both) == "b"
    assert served(["--served-model-name", "none"], both) == "a"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--instant=true"], True),
        (["--instant=no"], False),
        (["--instant=1"], True),
        (["--no-instant=true"], False),
        (["--no-instant=false"], True),
    ],
)
def test_a_switch_takes_a_value_after_an_equals_sign(argv: list[str], expected: bool) -> None:
    assert parse(argv, {})["instant"] is expected


def test_a_switch_given_a_word_that_is_not_true_or_false_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match=re.escape("--no-instant 'maybe': expected true or false")):
        parse(["--no-instant=maybe"], {})


@pytest.mark.parametrize(
    ("text", "expected"), [("y", True), ("T", True), ("n", False), ("f", False)]
)
def test_a_switch_reads_one_letter_words_from_its_variable(text: str, expected: bool) -> None:
    assert parse([], {"LLMGW_SIM_INSTANT": text})["instant"] is expected


def test_none_clears_an_optional_flag_its_variable_set() -> None:
    environ = {"LLMGW_SIM_EXIT_AFTER": "3", "LLMGW_SIM_EOS_AFTER": "None"}

    assert parse([], environ)["eos_after"] is None
    assert parse(["--exit-after", "none"], environ)["exit_after"] is None


def test_a_flag_is_never_guessed_from_its_first_letters() -> None:
    with pytest.raises(
        UsageError, match=re.escape("unknown option --inst; did you mean --instant?")
    ):
        parse(["--inst"], {})


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--model="], "--model is empty: give a model name, or leave the flag out"),
        (
            ["--served-model-name", " "],
            "--served-model-name is empty: give a model name, or leave the flag out",
        ),
        (["--host="], "--host is empty: give an address, or leave the flag out"),
        (["--model=--"], "--model needs a value: '--' ends the options"),
        (["--=x"], "unknown option --; see llmgw-sim-engine --help"),
        (["-"], "unknown option -; see llmgw-sim-engine --help"),
        (["---port", "1"], "unknown option ---port; see llmgw-sim-engine --help"),
        (
            ["--", "--port", "1"],
            "unexpected argument '--port': every setting is a flag; see llmgw-sim-engine --help",
        ),
    ],
)
def test_an_empty_value_or_a_flag_without_a_name_is_refused_plainly(
    argv: list[str], said: str
) -> None:
    """``--model=`` served a model named ""; ``--`` and ``--=x`` were "did you mean -h?"."""
    with pytest.raises(UsageError) as refused:
        parse(argv, {})

    assert str(refused.value) == said


def test_an_empty_variable_is_refused_naming_it() -> None:
    with pytest.raises(UsageError) as refused:
        parse([], {"LLMGW_SIM_SERVED_MODEL_NAME": ""})

    assert str(refused.value) == (
        "LLMGW_SIM_SERVED_MODEL_NAME is empty: give a model name, or unset it"
    )


def test_a_lone_double_dash_ends_the_options_as_for_the_other_programs() -> None:
    assert parse(["--port", "8001", "--"], {})["port"] == 8001


SIMULATOR = program("llmgw-sim-engine")


@pytest.mark.parametrize(
    ("argv", "environ", "line"),
    [
        (["--nope"], {}, "unknown option --nope; see llmgw-sim-engine --help"),
        (["-x"], {}, "unknown option -x; see llmgw-sim-engine --help"),
        (["--max-num-seq", "4"], {}, "unknown option --max-num-seq; did you mean --max-num-seqs?"),
        (["--port", "80a"], {}, "--port '80a': expected a whole number"),
        (["--port"], {}, "--port needs a value"),
        (["--profile", "tgi"], {}, "--profile 'tgi': expected one of vllm, sglang, llamacpp"),
        (["--max-num-seqs", "0"], {}, "--max-num-seqs '0': expected a whole number, 1 or more"),
        (
            ["--decode-base-ms", "-1"],
            {},
            "--decode-base-ms '-1': expected a number of milliseconds, 0 or more",
        ),
        (
            ["serve"],
            {},
            "unexpected argument 'serve': every setting is a flag; see llmgw-sim-engine --help",
        ),
        ([], {"LLMGW_SIM_PORT": "80a"}, "LLMGW_SIM_PORT='80a': expected a whole number"),
        (["--port", "70000"], {}, "--port '70000': expected a port, 0 to 65535"),
    ],
)
def test_bad_usage_is_one_line_on_stderr_and_exit_2(
    argv: list[str], environ: dict[str, str], line: str
) -> None:
    """As llmgw-agent, llmgw-cli, llmgw-server and llmgw-dev tell it: the program, then
    what is wrong, never argparse's usage block."""
    done = subprocess.run(
        [SIMULATOR, *argv],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": "40"} | environ,
        timeout=60,
        check=False,
    )

    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"llmgw-sim-engine: {line}\n")


def test_what_the_command_line_held_is_shown_as_visible_escapes() -> None:
    done = subprocess.run(
        [SIMULATOR, "--port", "\x1b[2J"], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.stderr == "llmgw-sim-engine: --port '\\x1b[2J': expected a whole number\n"


def test_the_help_is_laid_out_as_the_other_programs_and_names_each_variable() -> None:
    shown = build_parser().format_help()

    assert shown.startswith("Usage: llmgw-sim-engine [OPTIONS]\n")
    words = " ".join(shown.split())
    assert [name for flag in FLAGS for name in flag.variables if name not in words] == []
    assert "--port INT TCP port to listen on. [env var: LLMGW_SIM_PORT] [default: 8000]" in words


def test_the_help_lists_the_exit_codes_a_supervisor_acts_on() -> None:
    words = " ".join(build_parser().format_help().split())

    assert "Exit codes: 1 it cannot listen" in words
    assert "2 bad usage; 3 a fault it was told to show" in words
    assert "Stopped by SIGTERM or SIGINT, it ends by that signal." in words


def test_a_flag_far_longer_than_any_name_is_told_unknown_without_a_letter_by_letter_look() -> None:
    # A spec's engine argument of up to 128 KiB reaches the simulator's command line: the
    # guess at the name it meant compared it with every name letter by letter, over ten
    # seconds' work for the longest. The C calls made while it is told unknown stay a handful.
    word = "--" + "x" * 600
    calls = 0

    def counted(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "c_call"

    sys.setprofile(counted)
    try:
        with pytest.raises(UsageError) as refused:
            parse_settings([word], {})
    finally:
        sys.setprofile(None)
    assert str(refused.value) == f"unknown option {word}; see llmgw-sim-engine --help"
    assert calls < 1_000
