"""The simulator's command line: flags, their ``LLMGW_SIM_<FLAG>`` variables, and a start
that stays short."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agent.simulator.serve import build_parser, defaults_from_environment


def parse(argv: list[str], environ: dict[str, str]) -> dict[str, object]:
    parser = build_parser()
    parser.set_defaults(**defaults_from_environment(environ))
    return vars(parser.parse_args(argv))


def test_a_variable_gives_a_flag_its_value_and_the_command_line_wins() -> None:
    environ = {"LLMGW_SIM_MAX_NUM_SEQS": "3", "LLMGW_SIM_MODEL": "env-model"}

    from_environment = parse([], environ)
    from_both = parse(["--max-num-seqs", "5", "--served-model-name", "flag-model"], environ)

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
    assert parse([], {"LLMGW_SIM_SERVED_MODEL_NAME": "env-model"})["model"] == "env-model"


def test_a_flag_set_by_both_its_variables_is_refused_naming_them() -> None:
    both = {"LLMGW_SIM_MODEL": "a", "LLMGW_SIM_SERVED_MODEL_NAME": "b"}

    with pytest.raises(ValueError, match="LLMGW_SIM_MODEL and LLMGW_SIM_SERVED_MODEL_NAME"):
        defaults_from_environment(both)


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


def test_a_switch_given_a_word_that_is_not_true_or_false_ends_with_code_2() -> None:
    with pytest.raises(SystemExit) as ended:
        parse(["--instant=maybe"], {})

    assert ended.value.code == 2


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
    with pytest.raises(SystemExit) as ended:
        parse(["--inst"], {})

    assert ended.value.code == 2
