"""``llmgw-sim-engine``: start the engine simulator.

Every flag can also come from the environment as ``LLMGW_SIM_<FLAG>`` (``--max-num-seqs``
is ``LLMGW_SIM_MAX_NUM_SEQS``, ``--instant`` is ``LLMGW_SIM_INSTANT=true``); a flag on the
command line wins.

The simulator stands in for an engine whose start the agent, the gateway and the
autoscaler wait for, so its own start is kept short: the command line is the standard
library's ``argparse`` (as vLLM's is), and ``rich``, which structlog imports when it is
installed to print tracebacks the simulator never prints, is kept out. Together they were
two fifths of the process's start (``docs/simulator.md``). Bad usage is still told as the
other programs tell it: one line, exit 2 (``agent.simulator.flags``).
"""

from __future__ import annotations

import sys


def main() -> None:
    # Before structlog is imported: ``import rich`` then fails, and structlog goes without it.
    if "rich" not in sys.modules:
        sys.modules["rich"] = None  # type: ignore[assignment]
    from agent.simulator.serve import run

    sys.exit(run(sys.argv[1:]))
