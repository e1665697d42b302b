"""Whether the indexer's consumer is a member of its group, and the watchdog that ends a
process that has stopped being one for too long.

A consumer evicted from its group (its session expired, e.g. an event loop starved past the
session timeout) is meant to rejoin on its own. When it does not, it sits idle with its
partitions unassigned while the process looks alive: the watchdog makes that visible on
/healthz and exits the process, so that Kubernetes or `kgstream up` starts a new one, which
resumes from the committed offsets (docs/operations.md, "Indexer left its consumer group")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

Clock = Callable[[], float]


class _TopicPartition(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...


class Membership:
    """Whether the consumer has joined its group, the documents partitions it owns, and since
    when it has not been a member (the process's start counts as a departure)."""

    def __init__(self, topic: str, clock: Clock = time.monotonic) -> None:
        self.topic = topic
        self.joined = False
        self.assigned: set[tuple[str, int]] = set()
        self._clock = clock
        self.left_at: float | None = clock()

    def on_assigned(self, assigned: Iterable[_TopicPartition]) -> None:
        """A rebalance ended: joined, with these partitions (possibly none)."""
        self.joined = True
        self.left_at = None
        self.assigned = {(tp.topic, tp.partition) for tp in assigned if tp.topic == self.topic}

    def on_revoked(self) -> None:
        """A rebalance began: not a member until it ends. A revocation while already out of
        the group does not restart the clock (a consumer that keeps failing to rejoin)."""
        if self.joined or self.left_at is None:
            self.left_at = self._clock()
        self.joined = False

    def absent_for(self) -> float:
        """Seconds since the consumer last stopped being a member (0 while it is one)."""
        if self.joined or self.left_at is None:
            return 0.0
        return max(0.0, self._clock() - self.left_at)


def rejoin_timeout_s(configured: float | None, session_timeout_s: float) -> float:
    """The watchdog's limit: the configured one, else 20 session timeouts (120 s at the
    default 6 s). It must exceed a legitimate rebalance: a JoinGroup may wait up to faust's
    rebalance timeout (60 s) for slow members. (The watchdog runs with faust's app services,
    which start after the first assignment: the first join is not watched.)"""
    return configured if configured is not None else 20 * session_timeout_s


class RejoinWatchdog:
    """Says why the process should be restarted once the consumer has been out of its group
    for longer than ``timeout_s``; None while all is well."""

    def __init__(self, membership: Membership, group: str, timeout_s: float) -> None:
        self.membership, self.group, self.timeout_s = membership, group, timeout_s

    def overdue(self) -> str | None:
        """None while the consumer is a member or has been out for at most ``timeout_s``."""
        absent = self.membership.absent_for()
        if absent <= self.timeout_s:
            return None
        return (
            f"the consumer has not been a member of group {self.group} for {absent:.0f} s "
            f"(limit {self.timeout_s:g} s, KGSTREAM_INDEXER_REJOIN_TIMEOUT_S): it has not "
            "(re)joined since it started or left it"
        )


async def run_watchdog(
    watchdog: RejoinWatchdog, on_overdue: Callable[[str], None], interval_s: float = 1.0
) -> None:
    """Check every ``interval_s`` seconds; once overdue, hand the reason to ``on_overdue``
    (which ends the process) and return."""
    while True:
        reason = watchdog.overdue()
        if reason is not None:
            on_overdue(reason)
            return
        await asyncio.sleep(interval_s)
