"""The engine simulator: an OpenAI-compatible server with a capacity model.

It stands in for vLLM or SGLang where there are no GPUs. The pure core (``tokens``,
``kv_cache``, ``capacity``, ``prediction``) knows nothing of sockets or event loops; the
asyncio shell (``engine``) steps it in real time, and ``http_app`` serves it over HTTP with
vLLM's Prometheus metric names. ``main`` is the ``llmgw-sim-engine`` command line.
"""
