"""Secrets a spec must not carry inline: the log keeps every spec for ever, and shows it to
whoever can read the admin API, its backups and SQL on ``events``.

A variable whose name has a word (between ``_``) such as ``TOKEN``, ``KEY``, ``SECRET`` or
``PASSWORD`` (``HF_TOKEN``, ``OPENAI_API_KEY``; not ``TOKENIZERS_PARALLELISM``), and a
command flag that takes a secret (``--api-key``, ``--hf-token``; not
``--prefill-ms-per-token`` or ``--tls-key``: ``flag_names_a_secret``) given a value, are
refused. The place
for them is the node: the agent's environment, which every engine it starts inherits
(``agent.engines.spec.engine_env``). An engine reads its key from a variable too
(``LLAMA_API_KEY`` for llama.cpp, ``VLLM_API_KEY`` for vLLM), which keeps it out of the
process list as well.

The same words decide what the admin API withholds of a spec recorded before the rule
(``withhold_secrets``): the log keeps such a spec as it was, its answers do not show it.
No message here repeats a value.
"""

from __future__ import annotations

import re
import shlex

from app.domain.spec_error import SpecError

SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "PASS"})
"""A name holding one of these words, whole, names a secret..."""
REFERENCE_WORDS = frozenset({"FILE", "PATH", "DIR", "FD"})
"""...unless it also holds one of these: it names where a secret is (``--ssl-key-file``,
``HF_TOKEN_PATH``), which the spec may say."""
WITHHELD = "(withheld)"
"""What an answer shows instead of a secret recorded before the rule."""
_WORD_SEPARATORS = re.compile(r"[_\-.]+")
_SECRET_FLAG_WORDS = frozenset({"SECRET", "PASSWORD", "PASSWD", "APIKEY"})
_MAKES_SECRET = frozenset({"API", "HF", "HUB", "AUTH", "ACCESS", "BEARER", "SECRET"})
_ENGINE_KEY_VARIABLES = "LLAMA_API_KEY for llama.cpp, VLLM_API_KEY for vLLM"
_WHY = "the log keeps every spec for ever and shows it to every operator"


def names_a_secret(name: str) -> bool:
    """Whether a variable's or a flag's name holds a word that names a secret."""
    words = set(_WORD_SEPARATORS.split(name.strip("-").upper()))
    return bool(words & SECRET_WORDS) and not words & REFERENCE_WORDS


def flag_names_a_secret(flag: str) -> bool:
    """Whether a command flag takes a secret: its last word is ``SECRET``, ``PASSWORD``,
    ``PASSWD`` or ``APIKEY``, or ``TOKEN`` or ``KEY`` after a word that makes it one
    (``--api-key``, ``--hf-token``, ``--auth-token``), or it is ``--token`` alone. An
    engine's flags use the words for other things: ``--prefill-ms-per-token``,
    ``--bos-token``, and ``--tls-key`` or ``--key``, which name a file."""
    words = _WORD_SEPARATORS.split(flag.strip("-").upper())
    if set(words) & REFERENCE_WORDS:
        return False
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if last in _SECRET_FLAG_WORDS:
        return True
    if last == "TOKEN" and not before:
        return True
    return last in {"TOKEN", "KEY"} and before in _MAKES_SECRET


def secret_errors(command: str, env: dict[str, str]) -> list[SpecError]:
    """A secret-looking variable with a value, and a secret-looking flag given one."""
    errors = [
        SpecError(
            f"env.{name[:64]}",
            f"looks like a secret, and {_WHY}: leave it out of the spec and set {name[:64]} "
            "in the agent's environment on the nodes (every engine inherits it)",
        )
        for name, value in env.items()
        if value and names_a_secret(name)
    ]
    errors.extend(
        SpecError(
            "command",
            f"gives {flag} a value inline, and {_WHY}: set it in the agent's environment on "
            f"the nodes instead, as the variable the engine reads ({_ENGINE_KEY_VARIABLES})",
        )
        for flag in _flags_given_secrets(command)
    )
    return errors


def withhold_secrets(command: str, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """``command`` and ``env`` with every value ``secret_errors`` would refuse replaced by
    ``WITHHELD``: what an answer shows of a spec recorded before the rule."""
    shown_env = {
        name: WITHHELD if value and names_a_secret(name) else value for name, value in env.items()
    }
    shown = command
    for _, value in _secret_flags(command):
        shown = shown.replace(value, WITHHELD)  # the rest of the command stays as written
    return shown, shown_env


def _flags_given_secrets(command: str) -> list[str]:
    flags: list[str] = []
    for flag, _ in _secret_flags(command):
        if flag[:64] not in flags:
            flags.append(flag[:64])
    return flags


def _secret_flags(command: str) -> list[tuple[str, str]]:
    """Each secret-looking flag given a value, with the value."""
    lowered = command.lower()
    if not any(word.lower() in lowered for word in SECRET_WORDS):
        return []  # most commands: no splitting, which every answer showing a spec pays
    words = _words(command)
    found: list[tuple[str, str]] = []
    for index, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if not _is_flag(flag) or not flag_names_a_secret(flag):
            continue
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
            if value.startswith("-"):
                continue  # a flag of its own, no value
        if value:
            found.append((flag, value))
    return found


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word.lstrip("-")) > 0


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an open quote: refused by ``start_command_errors`` on its own
        return command.split()
