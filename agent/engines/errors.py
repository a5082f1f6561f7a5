"""Errors raised by engine supervision."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error raised by ``agent.engines``."""


class EngineLaunchError(EngineError):
    """An engine process could not be started (missing executable, exec refused, ...)."""


class PortHeldElsewhere(EngineError):
    """Another process listens on the engine's port: its answers are not the engine's."""


class ShardRunsOtherwise(EngineError):
    """A start for a shard whose engine already runs, on another port or other GPUs."""
