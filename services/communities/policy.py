"""When the communities worker recomputes (docs/architecture.md, "Communities and snapshots"): on
first build, on request, when a delete touched a published community (withheld from every caller
until then: docs/security.md, "Erasure"), past the change-ratio threshold, or when a changed graph
has waited the maximum staleness; never twice within the minimum interval. A pure function of the
state, so it is testable without a clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.core.change_state import ChangeState

Reason = Literal["first_build", "requested", "erasure", "threshold", "staleness"]


@dataclass(frozen=True)
class Policy:
    """The settings the decision uses."""

    threshold: float
    min_interval_s: float
    max_staleness_s: float


def decide(state: ChangeState, policy: Policy) -> Reason | None:
    """Why to recompute now, or None to wait."""
    if not _interval_passed(state, policy):  # also spaces out retries after a failed build
        return None
    if state.snapshot_id is None and not state.graph_empty:
        return "first_build"
    if state.requested:
        return "requested"
    if state.erased:
        return "erasure"
    return _changed_enough(state, policy)


def _changed_enough(state: ChangeState, policy: Policy) -> Reason | None:
    ratio = state.ratio
    if ratio > policy.threshold:
        return "threshold"
    if ratio > 0 and (state.since_publish_s or 0.0) >= policy.max_staleness_s:
        return "staleness"
    return None


def _interval_passed(state: ChangeState, policy: Policy) -> bool:
    return state.since_last_run_s is None or state.since_last_run_s >= policy.min_interval_s
