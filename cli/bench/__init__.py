"""`llmgw-cli bench`: climb concurrency against one engine until a latency SLO breaks, and
turn what the engine showed at the last level that met it into routing settings.

Pure parts decide: ``slo`` (targets and verdicts), ``climb`` (which level next),
``prompts``, ``metrics`` (reading a scrape), ``stats`` (a level's figures), ``recommend``,
``report``. The shell talks to the engine: ``request`` (one streamed completion),
``load`` (one level's closed loop), ``sampler`` (/metrics during a level), ``probe``
(before the first level), ``runner`` (the climb). ``execute``, ``table``, ``chart`` and
``progress`` show and write what was found; ``command`` is the command line.
"""
