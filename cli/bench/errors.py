"""What ends a bench early; every message is meant for the operator::

BenchError
├── TargetUnreachable    no connection to the engine, or it stopped answering
├── TargetRefused        the engine answered, but not as an OpenAI-compatible engine
│                        serving the model would (unknown model, an error status)
└── MetricsUnavailable   no /metrics, none of the queue and KV-cache gauges bench reads, or
                         a page past 16 MiB
"""

from __future__ import annotations


class BenchError(Exception):
    pass


class TargetUnreachable(BenchError):
    pass


class TargetRefused(BenchError):
    pass


class MetricsUnavailable(BenchError):
    pass
