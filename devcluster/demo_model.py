"""The ``demo`` model ``llmgw-dev`` declares, served by the engine it is told
(``--engine``): the engine simulator, or llama.cpp's ``llama-server`` with a real model on
the CPU (the ``llamacpp`` extra, ``devcluster.llamacpp``).

A state directory keeps the engine its demo model was first declared with. Its log's
replicas restart from the spec the log holds, and engines adopted after an abrupt stop
keep running the command they were started with, so changing the engine in place would
leave replicas of both behind one name. A run asking for the other engine is refused
instead, saying which state directory to use (``engine_conflict``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

from app.domain.model_spec import API_NAMES
from devcluster.llamacpp import (
    INSTALL_HINT,
    assembled_model,
    llama_server,
    model_cache,
    serve_command,
)
from devcluster.programs import simulator_command

DevEngine = Literal["simulator", "llamacpp"]
ENGINES: tuple[DevEngine, ...] = get_args(DevEngine)
MODEL = "demo"
STARTUP_TIMEOUT_S = 60

SIMULATOR_FLAGS = (
    *("--max-num-seqs", "16", "--decode-base-ms", "5", "--prefill-ms-per-token", "0.05"),
)
LLAMACPP_SLOTS = 4
LLAMACPP_CONTEXT = 4096
"""Shared by the slots: 1024 tokens each."""
LLAMACPP_MAX_TOKENS = 128
"""How long an answer is when the request gives no ``max_tokens`` (``-n``): the model is a
base model that rarely stops by itself, and a CPU writes a few dozen tokens a second."""
LLAMACPP_FLAGS = (
    *("--no-jinja", "--chat-template", "gemma"),
    *("-n", str(LLAMACPP_MAX_TOKENS)),
)
"""The model's file carries no chat template, so llama.cpp's built-in ``gemma`` one. Only
with ``--no-jinja``: with Jinja (this build's default) the name is taken as a template
whose whole text is "gemma", and the model never sees the messages."""
MAX_THREADS = 4
"""More threads buy a 270M-parameter model little."""

SERVED_BY: dict[DevEngine, str] = {
    "simulator": "the engine simulator",
    "llamacpp": "llama.cpp's llama-server with a real 270M-parameter model (gemma 3, CPU)",
}
ENGINE_NAMES: dict[DevEngine, str] = {"simulator": "the engine simulator", "llamacpp": "llama.cpp"}
DEFAULT_STATE_DIRS: dict[DevEngine, Path] = {
    "simulator": Path(".llmgw/dev"),
    "llamacpp": Path(".llmgw/dev-llamacpp"),
}


def engine_unavailable(engine: DevEngine, missing: list[str]) -> str | None:
    """Why ``engine`` cannot run here (the packages it needs are ``missing``), else None."""
    if engine != "llamacpp" or not missing:
        return None
    return (
        f"--engine llamacpp needs the llamacpp extra ({', '.join(missing)} missing); "
        f"install it with {INSTALL_HINT}"
    )


def engine_threads(cpus: int, replicas: int) -> int:
    """Threads per engine: half the machine's CPUs, shared by the replicas (the other half
    is for the control plane, the agents and the clients), 1 to ``MAX_THREADS``."""
    return max(1, min(MAX_THREADS, cpus // 2 // max(1, replicas)))


def llamacpp_spec(server: Path, model: Path, *, replicas: int, cpus: int) -> dict[str, object]:
    command = serve_command(
        server,
        model,
        slots=LLAMACPP_SLOTS,
        context=LLAMACPP_CONTEXT,
        threads=engine_threads(cpus, replicas),
        flags=LLAMACPP_FLAGS,
    )
    return _spec(replicas) | {"engine": "llamacpp", "command": command}


def simulator_spec(*, replicas: int) -> dict[str, object]:
    return _spec(replicas) | {
        "command": simulator_command(*SIMULATOR_FLAGS),
        # The simulator answers every API a spec can name (docs/simulator.md).
        "apis": list(API_NAMES),
    }


def demo_spec(engine: DevEngine, *, replicas: int) -> dict[str, object]:
    """The demo model's spec on ``engine``; for llama.cpp, the model's file is assembled
    into the user's cache first if it is not there yet (a few seconds, once)."""
    if engine == "simulator":
        return simulator_spec(replicas=replicas)
    model = assembled_model(model_cache())
    return llamacpp_spec(llama_server(), model, replicas=replicas, cpus=_cpus())


def served_by(engine: str, command: str) -> DevEngine | None:
    """Which of ``llmgw-dev``'s engines a declared spec runs; None for any other spec (an
    operator's own, left as it is)."""
    if engine == "llamacpp":
        return "llamacpp"
    if "llmgw-sim-engine" in command:
        return "simulator"
    return None


def engine_conflict(wanted: DevEngine, declared: DevEngine | None, state_dir: Path) -> str | None:
    """Why a run on ``wanted`` cannot use ``state_dir``, whose demo model was declared on
    ``declared``; None when it can."""
    if declared is None or declared == wanted:
        return None
    return (
        f"the {MODEL} model in {state_dir} was declared by an earlier run on "
        f"{ENGINE_NAMES[declared]}; to run {ENGINE_NAMES[wanted]}, give it a state directory "
        f"of its own (--state-dir; {DEFAULT_STATE_DIRS[wanted]} by default), or run "
        f"{_dev_command(declared)} --state-dir {state_dir} to keep {ENGINE_NAMES[declared]}"
    )


def _dev_command(engine: DevEngine) -> str:
    return "llmgw-dev" if engine == "simulator" else f"llmgw-dev --engine {engine}"


def _spec(replicas: int) -> dict[str, object]:
    return {"name": MODEL, "replicas": replicas, "startup_timeout_s": STARTUP_TIMEOUT_S}


def _cpus() -> int:
    return len(os.sched_getaffinity(0))
