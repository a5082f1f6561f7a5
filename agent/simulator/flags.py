"""``llmgw-sim-engine``'s command line: its flags, each also read from ``LLMGW_SIM_<FLAG>``
(the command line winning), and bad usage told in one line, as every llmgw program tells
it (``app.usage_errors``)::

    llmgw-sim-engine: unknown option --nope; see llmgw-sim-engine --help
    llmgw-sim-engine: --port '80a': expected a whole number
    llmgw-sim-engine: LLMGW_SIM_PORT='80a': expected a whole number
    llmgw-sim-engine: --model is empty: give a model name, or leave the flag out

A lone ``--`` ends the options, as it does for the other programs: nothing may follow it,
since every setting is a flag.

It is the standard library's argparse rather than cyclopts, and imports no ``rich``: the
simulator's start is what the agent, the gateway and the autoscaler wait for
(``agent.simulator.main``). argparse's own usage-and-error block is never printed; the
guess at a mistyped flag is the other programs' (``app.usage_words``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, get_args

from agent.simulator.config import CapacityConfig, ErrorStyle
from agent.simulator.metrics import SimulatedProfile
from app.usage_words import closest, finite_number, whole_number

PROGRAM = "llmgw-sim-engine"
ENV_PREFIX = "LLMGW_SIM_"
TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE_WORDS = frozenset({"0", "false", "f", "no", "n", "off"})
NONE_WORD = "none"
"""Given to a flag without a default (``--exit-after none``): not set, as if not given."""

_defaults = CapacityConfig()


class UsageError(Exception):
    """A command line or variable the simulator cannot run on; the message is what follows
    ``llmgw-sim-engine: `` on its one line."""


class EmptyValue(ValueError):
    """A text flag given empty or blank; the message says what to give instead."""


def _filled(what: str) -> Callable[[str], str]:
    """A text that is not empty: ``--model=`` (a variable meant to be filled in and left
    blank) would serve a model of no name, ``--host=`` listen on every address."""

    def text(value: str) -> str:
        if not value.strip():
            raise EmptyValue(f"give {what}")
        return value

    return text


def _whole_number(text: str) -> int:
    """Decimal digits only: ``int`` would take ``1_0`` for 10 and non-ASCII digits for
    their value (``usage_words.whole_number``)."""
    value = whole_number(text)
    if value is None:
        raise ValueError("expected a whole number")
    return value


def _at_least(low: int) -> Callable[[str], int]:
    def whole_number(text: str) -> int:
        value = _whole_number(text)
        if value < low:
            raise ValueError(f"expected a whole number, {low} or more")
        return value

    return whole_number


def _port(text: str) -> int:
    value = _whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError("expected a port, 0 to 65535")
    return value


def _amount(unit: str) -> Callable[[str], float]:
    """A number of ``unit``: 0 or more, and finite (nan would compare false with every
    time, inf make a step never end), in decimal (``usage_words.finite_number``)."""

    def number(text: str) -> float:
        value = finite_number(text)
        if value is None:
            raise ValueError(f"expected a number of {unit}")
        if value < 0:
            raise ValueError(f"expected a number of {unit}, 0 or more")
        return value

    return number


class Flag(NamedTuple):
    """One flag: its names, how its value is read (None: a switch, ``--x``/``--no-x``).
    A reader raises ValueError saying what it expected."""

    names: tuple[str, ...]
    help: str
    read: Callable[[str], object] | None
    default: object = None
    choices: tuple[str, ...] | None = None
    metavar: str = ""

    @property
    def dest(self) -> str:
        return self.names[0].removeprefix("--").replace("-", "_")

    @property
    def variables(self) -> tuple[str, ...]:
        """``LLMGW_SIM_<FLAG>`` for each of its names."""
        return tuple(
            ENV_PREFIX + name.removeprefix("--").replace("-", "_").upper() for name in self.names
        )


FLAGS = (
    Flag(("--port",), "TCP port to listen on.", _port, 8000, metavar="INT"),
    Flag(("--host",), "Address to listen on.", _filled("an address"), "127.0.0.1", metavar="STR"),
    Flag(
        ("--model",),
        "The model an engine would load; the simulator loads nothing, and serves it under "
        "this name unless --served-model-name names it otherwise.",
        _filled("a model name"),
        "sim-model",
        metavar="STR",
    ),
    Flag(
        ("--served-model-name",),
        "The model name clients use, whatever the order of the flags (as vLLM's): "
        "requests for any other model get 404; none serves the --model name.",
        _filled("a model name"),
        metavar="STR",
    ),
    Flag(
        ("--max-num-seqs",),
        "Sequences that run at once; the others wait, first come first served.",
        _at_least(1),
        _defaults.max_num_seqs,
        metavar="INT",
    ),
    Flag(
        ("--block-size",),
        "Tokens per KV-cache block.",
        _at_least(1),
        _defaults.block_size,
        metavar="INT",
    ),
    Flag(
        ("--num-blocks",),
        "KV-cache blocks in the whole cache.",
        _at_least(1),
        _defaults.num_blocks,
        metavar="INT",
    ),
    Flag(
        ("--prefill-ms-per-token",),
        "Prefill time per prompt token not found in the prefix cache.",
        _amount("milliseconds"),
        _defaults.prefill_ms_per_token,
        metavar="MS",
    ),
    Flag(
        ("--decode-base-ms",),
        "Fixed part of one decode step.",
        _amount("milliseconds"),
        _defaults.decode_base_ms,
        metavar="MS",
    ),
    Flag(
        ("--decode-per-seq-ms",),
        "Part of one decode step added by each running sequence.",
        _amount("milliseconds"),
        _defaults.decode_per_seq_ms,
        metavar="MS",
    ),
    Flag(("--instant",), "Set every simulated time to zero.", None, False),
    Flag(
        ("--start-delay",),
        "Seconds before /health answers 200 (503 until then).",
        _amount("seconds"),
        0.0,
        metavar="S",
    ),
    Flag(("--never-ready",), "/health answers 503 for ever.", None, False),
    Flag(
        ("--exit-after",),
        "Exit with a failure this many seconds after start.",
        _amount("seconds"),
        metavar="S",
    ),
    Flag(
        ("--crash-after-requests",),
        "Exit with a failure after serving this many completion requests.",
        _at_least(0),
        metavar="INT",
    ),
    Flag(
        ("--without-metrics",),
        "/metrics answers 404, as an engine without a metrics exporter does.",
        None,
        False,
    ),
    Flag(
        ("--eos-after",),
        "The model ends its answer after this many tokens (finish_reason stop) unless the "
        "request sets ignore_eos; without it answers run to max_tokens.",
        _at_least(1),
        metavar="INT",
    ),
    Flag(
        ("--error-style",),
        'Error bodies: openai ({"error": {...}}), flat ({"detail": ...}) or message '
        '({"object": "error", "message": ...}).',
        str,
        "openai",
        get_args(ErrorStyle),
    ),
    Flag(
        ("--profile",),
        "Whose metric names /metrics speaks: vllm, sglang or llamacpp (llama.cpp's server: "
        "no labels, no KV-cache gauge).",
        str,
        "vllm",
        get_args(SimulatedProfile),
    ),
)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The layout of the other programs' help: ``Usage:``, the description, the options
    each with its variable and default, an example."""

    def add_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[Any],
        prefix: str | None = None,
    ) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``FLAGS``. It never exits on a bad one (``parse`` tells it)."""
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        usage="%(prog)s [OPTIONS]",
        add_help=False,
        allow_abbrev=False,
        exit_on_error=False,
        formatter_class=_HelpFormatter,
        description="An OpenAI-compatible engine simulator with a capacity model and the "
        "metrics of vLLM, SGLang\nor llama.cpp's server (docs/simulator.md).\n\n"
        f"Every flag can also be set as {ENV_PREFIX}<FLAG> in the environment "
        f"({ENV_PREFIX}MAX_NUM_SEQS=4,\n{ENV_PREFIX}INSTANT=true); the command line wins.",
        epilog="Exit codes: 1 it cannot listen (the port in use, a host not this machine's);\n"
        "2 bad usage; 3 a fault it was told to show (--exit-after, --crash-after-requests).\n"
        "Stopped by SIGTERM or SIGINT, it ends by that signal.\n\n"
        f"Example: {PROGRAM} --port 8001 --model llama-sim --profile sglang",
    )
    options = parser.add_argument_group("Options")
    options.add_argument("-h", "--help", action="help", help="Display this message and exit.")
    for flag in FLAGS:
        variables = ", ".join(flag.variables)
        if flag.read is None:
            options.add_argument(
                *flag.names, *(f"--no-{name.removeprefix('--')}" for name in flag.names),
                dest=flag.dest, action=_Switch, default=flag.default,
                help=f"{flag.help} [env var: {variables}]",
            )  # fmt: skip
        else:
            shown_default = f" [default: {'none' if flag.default is None else flag.default}]"
            options.add_argument(
                *flag.names, dest=flag.dest, type=_typed(flag), default=flag.default,
                metavar="{" + ",".join(flag.choices) + "}" if flag.choices else flag.metavar,
                help=f"{flag.help} [env var: {variables}]{shown_default}",
            )  # fmt: skip
    return parser


def served_model(options: argparse.Namespace) -> str:
    """The model name clients use: ``--served-model-name``, else ``--model``, as vLLM."""
    served: str | None = options.served_model_name
    model: str = options.model
    return model if served is None else served


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """The settings ``argv`` and ``LLMGW_SIM_<FLAG>`` give, the command line winning.

    Raises UsageError saying what is wrong: the unknown word first (with the real name it
    most likely meant), else the flag or variable and what it expects."""
    parser = build_parser()
    try:
        parser.set_defaults(**defaults_from_environment(environ))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # "--" ends the options; whatever follows it is an argument, and none is taken.
    flags, after = _split_at_end_of_options(argv)
    try:
        options, unknown = parser.parse_known_args(flags)
    except argparse.ArgumentError as exc:
        name = (exc.argument_name or "a flag").split("/")[0]
        if exc.message == "expected one argument":
            raise UsageError(f"{name} needs a value") from None
        raise UsageError(f"{name} {exc.message}") from None
    if unknown or after:
        raise UsageError(_unknown(unknown[0]) if unknown else _unexpected(after[0]))
    for flag in FLAGS:
        # argparse drops a value of "--" (``--model=--``) and sets the flag to [] unread.
        if isinstance(getattr(options, flag.dest), list):
            raise UsageError(f"{flag.names[0]} needs a value: '--' ends the options")
    return options


def _split_at_end_of_options(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    words = list(argv)
    if "--" not in words:
        return words, []
    end = words.index("--")
    return words[:end], words[end + 1 :]


def _unexpected(token: str) -> str:
    return f"unexpected argument {token!r}: every setting is a flag; see {PROGRAM} --help"


def _unknown(token: str) -> str:
    if not token.startswith("-"):
        return _unexpected(token)
    word = token.split("=", 1)[0]
    if not word.lstrip("-") or word.startswith("---"):
        # No name to mend ("-", "--=x", "---x"): a guess would be a name picked at random.
        return f"unknown option {word}; see {PROGRAM} --help"
    names = ["--help", "-h"]
    for flag in FLAGS:
        names.extend(flag.names)
        if flag.read is None:
            names.extend(f"--no-{name.removeprefix('--')}" for name in flag.names)
    guess = closest(word, names)
    hint = f"did you mean {guess}?" if guess else f"see {PROGRAM} --help"
    return f"unknown option {word}; {hint}"


def defaults_from_environment(environ: Mapping[str, str]) -> dict[str, object]:
    """The flags ``LLMGW_SIM_<FLAG>`` sets, read as the flag would read them.

    Raises ValueError naming the variable when a value does not parse."""
    found: dict[str, object] = {}
    for flag in FLAGS:
        given = [name for name in flag.variables if name in environ]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are both set; set one")
        if not given:
            continue
        variable, text = given[0], environ[given[0]]
        try:
            found[flag.dest] = _read(flag, text)
        except EmptyValue as exc:
            raise ValueError(f"{variable} is empty: {exc}, or unset it") from None
        except ValueError as exc:
            raise ValueError(f"{variable}={text!r}: {exc}") from None
    return found


def _read(flag: Flag, text: str) -> object:
    """``text`` as ``flag`` reads it; a flag without a default also reads ``none``."""
    if flag.read is None:
        return _switch_word(text)
    if flag.default is None and text.strip().lower() == NONE_WORD:
        return None
    value = flag.read(text)
    if flag.choices is not None and value not in flag.choices:
        raise ValueError(f"expected one of {', '.join(flag.choices)}")
    return value


def _typed(flag: Flag) -> Callable[[str], object]:
    """``_read`` as argparse's ``type``: its refusal names the value."""

    def typed(text: str) -> object:
        try:
            return _read(flag, text)
        except EmptyValue as exc:
            raise argparse.ArgumentTypeError(f"is empty: {exc}, or leave the flag out") from None
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None

    return typed


def _switch_word(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS | FALSE_WORDS:
        return word in TRUE_WORDS
    raise ValueError("expected true or false")


class _Switch(argparse.Action):
    """``--x`` and ``--no-x``, and ``--x=WORD`` / ``--no-x=WORD`` with a true or false word
    (``--instant=false`` is ``--no-instant``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        try:
            on = True if values is None else _switch_word(str(values))
        except ValueError as exc:
            raise UsageError(f"{option_string} {values!r}: {exc}") from None
        negated = option_string is not None and option_string.startswith("--no-")
        setattr(namespace, self.dest, on != negated)
