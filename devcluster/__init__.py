"""``llmgw-dev`` and the process orchestration it shares with the tests and benchmarks.

A fourth program beside ``llmgw-server``, ``llmgw-agent`` and ``llmgw-cli``: it starts
llmgw's own programs as an operator would, on one machine, and talks to them only as
their users do (the admin API through llmgw-cli's client, ``llmgw-cli cert``,
``llmgw-server migrate``, ``llmgw-agent stop-engines``). Nothing in ``app``, ``agent`` or
``cli`` imports it.

| module | what it holds |
| --- | --- |
| ``main`` | the ``llmgw-dev`` command line |
| ``dev`` | one dev run: start everything, wait until the demo model serves, stop in order |
| ``demo_model`` | the demo model on each ``--engine``; the engine a state directory keeps |
| ``llamacpp`` | the ``llamacpp`` extra: the real model assembled into the cache, ``llama-server`` |
| ``orchestrator`` | ``Processes``: starts servers, gateways and agents; stops and reaps them |
| ``programs`` | the command lines of ``serve``, ``gateway``, ``llmgw-agent``, the simulator |
| ``processes`` | a child process: its own session, its log file, SIGTERM then SIGKILL |
| ``pki`` | certificates through ``llmgw-cli cert`` |
| ``ports`` | free ports, and engine port ranges no other cluster uses |
| ``readiness`` | waiting for a condition with a deadline, and the probes |
| ``database``, ``postgres``, ``docker`` | PostgreSQL: configured, local binaries, or a container |
| ``admin`` | what ``llmgw-dev`` asks of the admin API |
| ``next_steps`` | what ``llmgw-dev`` prints once the cluster is up |

Exceptions are in ``devcluster.errors``.
"""
