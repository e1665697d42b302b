"""The communities worker's job, as a plain async function the scheduler calls: read the
change state, decide, take the cross-replica lock, decide again under it, recompute."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from services.communities.lock import recompute_lock
from services.communities.policy import Policy, decide
from services.communities.recompute import RecomputeDeps, RecomputeResult, recompute
from services.core.change_state import ChangeState, read_change_state

log = logging.getLogger(__name__)

Outcome = Literal["idle", "locked", "published"]


@dataclass(frozen=True)
class TickResult:
    """What one scheduler tick did."""

    outcome: Outcome
    state: ChangeState
    result: RecomputeResult | None = None


async def tick(deps: RecomputeDeps, policy: Policy) -> TickResult:
    """Recompute when the policy says so and no other worker is at it. A failed recompute
    raises (its snapshot is marked failed; the next tick tries again after the minimum
    interval)."""
    observer = deps.observer
    state = await _state(deps)
    observer.change(state.ratio, policy.threshold)
    observer.withheld(state.withheld)
    if decide(state, policy) is None:
        observer.check("wait")
        return TickResult("idle", state)
    async with _timed_lock(deps) as held:
        if not held:
            observer.check("locked")
            log.info("another worker holds the recompute lock; skipping this tick")
            return TickResult("locked", state)
        # Another replica may have published between our first look and the lock.
        state = await _state(deps)
        reason = decide(state, policy)
        if reason is None:
            observer.check("wait")
            return TickResult("idle", state)
        observer.check("recompute")
        log.info("recomputing communities (%s, change ratio %.4f)", reason, state.ratio)
        return TickResult("published", state, await recompute(deps, reason))


async def run_now(deps: RecomputeDeps, reason: str = "requested") -> RecomputeResult | None:
    """Recompute at once regardless of the policy; None when another worker holds the lock."""
    async with _timed_lock(deps) as held:
        if not held:
            log.info("another worker holds the recompute lock; not recomputing")
            return None
        return await recompute(deps, reason)


@contextlib.asynccontextmanager
async def _timed_lock(deps: RecomputeDeps) -> AsyncIterator[bool]:
    """The recompute lock, the time spent asking for it reported to the observer."""
    start = time.perf_counter()
    async with recompute_lock(deps.database_url) as held:
        deps.observer.lock_wait(time.perf_counter() - start)
        yield held


async def _state(deps: RecomputeDeps) -> ChangeState:
    async with deps.engine.connect() as conn:
        return await read_change_state(conn)
