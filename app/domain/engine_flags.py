"""What the engine's own words in a spec's command say wrong: no port, or a flag it reads
once given twice.

Without ``{port}`` anywhere in the command and no port flag of its own, llama-server,
vLLM and SGLang listen on their default port (8080, 8000, 30000): never where the agent
probes, so every replica times out starting, or fails on a port another engine holds.

llama-server, vLLM and SGLang take the last of a repeated flag without a word, so
``--port {port} ... --port 8080`` listens where the agent never probes (every replica times
out starting, or fails on a port another engine holds), and a second ``-m`` or ``--alias``
serves another model, or under another name, than the first one says. Refused when the spec
is applied, naming the flag and both values.

Only the engine's own words are read: those after its program (``llama-server``, ``vllm
serve``, ``sglang.launch_server``). A wrapper's words before it (``docker --host ...``) are
the wrapper's, and a script given to a shell is one word, not read. ``openai`` servers are
anyone's: nothing is known of their flags.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from app.domain.spec_error import SpecError

SINGLE_FLAGS: Mapping[str, tuple[tuple[str, ...], ...]] = MappingProxyType(
    {
        "llamacpp": (("--port",), ("--host",), ("-m", "--model"), ("-a", "--alias")),
        "vllm": (("--port",), ("--host",), ("--served-model-name",)),
        "sglang": (("--port",), ("--host",), ("--model-path",), ("--served-model-name",)),
    }
)
"""Per engine, the flags (each with its other spellings) whose last value wins."""

_PROGRAMS: Mapping[str, tuple[tuple[str, ...], ...]] = MappingProxyType(
    {
        "llamacpp": (("llama-server",), ("llama-cpp-server",)),
        "vllm": (("vllm", "serve"), ("vllm.entrypoints.openai.api_server",)),
        "sglang": (("sglang.launch_server",),),
    }
)
"""Per engine, the words its own arguments follow (a program's base name, a subcommand, a
module run with ``python -m``)."""


DEFAULT_PORTS: Mapping[str, int] = MappingProxyType(
    {"llamacpp": 8080, "vllm": 8000, "sglang": 30000}
)
"""Where each engine listens when it is given no port."""


def engine_flag_errors(command: str, engine: str) -> list[SpecError]:
    """By the field ``command``: an engine started from its program with no port at all;
    then one error per flag of ``SINGLE_FLAGS[engine]`` that the engine's words give twice
    or more."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []  # start_command_errors says why
    own = _engine_words(words, _PROGRAMS.get(engine, ()))
    if own is None:
        return []
    errors = []
    if "{port}" not in command and not _values_of(own, ("--port",)):
        errors.append(
            SpecError(
                "command",
                f"gives the engine no port: it would listen on its default "
                f"({DEFAULT_PORTS[engine]}), where the agent never probes; add --port {{port}}",
            )
        )
    for spellings in SINGLE_FLAGS.get(engine, ()):
        given = _values_of(own, spellings)
        if len(given) > 1:
            shown = ", then ".join(f"{flag} {value}" for flag, value in given)
            errors.append(
                SpecError(
                    "command",
                    f"gives {spellings[-1]} {len(given)} times ({shown}): the engine would "
                    "take the last one without a word; give it once",
                )
            )
    return errors


def _engine_words(words: Sequence[str], programs: Sequence[tuple[str, ...]]) -> list[str] | None:
    """The words after the engine's program; None when the command does not start it."""
    for index, word in enumerate(words):
        for program in programs:
            head, *rest = program
            following = list(words[index + 1 : index + 1 + len(rest)])
            if posixpath.basename(word) == head and following == rest:
                return list(words[index + 1 + len(rest) :])
    return None


def _values_of(words: Sequence[str], spellings: Sequence[str]) -> list[tuple[str, str]]:
    given = []
    for index, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if flag not in spellings:
            continue
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else "(no value)"
        given.append((flag, value[:64]))
    return given
