"""llmgw-cli's usage errors: one line on stderr (``app/usage_errors.py`` says how it is
worded, the same for every program), written through the CLI's own escaping console, and
with the CLI's refused values told after their option (``--max must be a whole number,
got 2.5``).
"""

from __future__ import annotations

from cyclopts import CycloptsError
from rich.console import Console
from rich.text import Text

from app.usage_errors import usage_error_line as program_usage_error_line
from cli.arguments import ArgumentRefused
from cli.render import make_console, text

PROGRAM = "llmgw-cli"


def usage_error_console() -> Console:
    """stderr, never wrapped: the error stays one line however narrow the terminal."""
    return make_console(stderr=True, soft_wrap=True)


def usage_error_line(error: CycloptsError) -> Text:
    """``llmgw-cli keys create: unknown option --model; did you mean --models?``"""
    return text(program_usage_error_line(PROGRAM, error, refusals=(ArgumentRefused,)))
