"""The restart backoff `kgstream up` applies to every process it supervises."""

from __future__ import annotations

import time


class RestartPolicy:
    """Backoff between restarts of one process: ``base_s``, doubling up to ``cap_s``. A process
    that ran for ``stable_s`` before exiting starts the count again. ``max_quick`` restarts in a
    row that each exited sooner make a crash loop (e.g. bad settings): the supervisor says so,
    and keeps restarting at ``cap_s`` (or, before the stack was ever ready, gives up)."""

    def __init__(
        self,
        base_s: float = 1.0,
        cap_s: float = 30.0,
        stable_s: float = 60.0,
        max_quick: int = 5,
    ) -> None:
        self.base_s, self.cap_s, self.stable_s, self.max_quick = base_s, cap_s, stable_s, max_quick
        self.quick = 0
        self.started_at = time.monotonic()
        self.due_at: float | None = None

    def on_exit(self, now: float) -> float:
        """The process exited at ``now``: seconds to wait before restarting it. Schedules the
        restart (``due_at``)."""
        if now - self.started_at >= self.stable_s:
            self.quick = 0
        self.quick += 1
        delay = min(self.cap_s, self.base_s * 2.0 ** (self.quick - 1))
        self.due_at = now + delay
        return delay

    def on_planned_exit(self, now: float) -> None:
        """The process exited because the supervisor stopped it (a planned restart): that is
        no crash, so the count starts again and the restart is due at once."""
        self.quick, self.due_at = 0, now

    @property
    def crash_looping(self) -> bool:
        """More than ``max_quick`` exits in a row, each within ``stable_s`` of its start."""
        return self.quick > self.max_quick

    def on_start(self, now: float) -> None:
        """The process was (re)started at ``now``."""
        self.started_at, self.due_at = now, None
