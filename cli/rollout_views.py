"""What the admin API answers about a model's rollout and its past rollouts, as far as
``llmgw-cli rollout`` renders it (``--output json`` prints the answers whole).

Declared from the API's JSON, as ``cli.views`` is: every field has a default so that an
older or newer server still reads.
"""

from __future__ import annotations

from datetime import datetime

from cli.client import EventView
from cli.views import MoveView, ReplicaTrafficView, View

UNDER_WAY = ("running", "paused", "rolling_back")


class RolloutStepView(View, frozen=True, kw_only=True):
    replicas: int | str = "all"
    target: int = 0
    traffic: float | None = None
    hold_s: float = 0.0


class CanaryTrafficView(View, frozen=True, kw_only=True):
    revision: int
    share: float


class RolloutView(View, frozen=True, kw_only=True):
    model: str = ""
    rollout_id: str
    state: str = ""
    finished: bool = False
    revision: int = 0
    from_revision: int = 0
    model_revision: int = 0
    undoes: str | None = None
    started_at: datetime | None = None
    step: int = 0
    steps: list[RolloutStepView] = []
    step_started_at: datetime | None = None
    holding_since: datetime | None = None
    hold_left_s: float | None = None
    hold_ejections: dict[str, int] = {}
    pause_reason: str | None = None
    promoted: bool = False
    desired: int = 0
    replicas_by_revision: dict[str, dict[str, int]] = {}
    moves: list[MoveView] = []
    max_surge: int = 0
    max_unavailable: int = 0
    failures: int = 0
    max_failures: int = 0
    last_failure: str | None = None
    verdict: str | None = None
    canary: CanaryTrafficView | None = None
    outcome: str | None = None
    finished_at: datetime | None = None
    traffic_by_revision: dict[str, ReplicaTrafficView] = {}
    verdict_waits_for: str | None = None

    @property
    def current_step(self) -> RolloutStepView | None:
        return self.steps[self.step] if 0 <= self.step < len(self.steps) else None


class RolloutChange(View, frozen=True, kw_only=True):
    changed: bool
    rollout: RolloutView


class RolloutRecordView(View, frozen=True, kw_only=True):
    rollout_id: str
    revision: int = 0
    from_revision: int = 0
    undoes: str | None = None
    started_at: datetime | None = None
    started_by: str = ""
    changes_summary: str = ""
    state: str = ""
    outcome: str | None = None
    finished_at: datetime | None = None
    events: list[EventView] = []


class RolloutHistoryView(View, frozen=True, kw_only=True):
    model: str = ""
    rollouts: list[RolloutRecordView] = []
    next_before: int | None = None
