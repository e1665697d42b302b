"""Liveness of the API's main event loop, for the probes served from another thread
(probe_server.py): a task on the main loop records the time every second; the probes fail when
that time is older than ``stall_s``. A loop blocked by a stuck call stops ticking and is
restarted by the liveness probe; a loop that is merely busy with a flood still ticks, so a
flood alone never fails the probes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

TICK_S = 1.0


class Heartbeat:
    """``run`` on the main loop; ``stalled_for`` from any thread."""

    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s, self._clock = stall_s, clock
        self._last = clock()  # fresh until the loop has had the chance to tick

    def beat(self) -> None:
        """Record that the main loop ran just now."""
        self._last = self._clock()

    def stalled_for(self) -> float | None:
        """Seconds since the last beat when that is more than ``stall_s``, else None."""
        age = self._clock() - self._last
        return age if age > self.stall_s else None

    async def run(self) -> None:
        """Beat every TICK_S until cancelled."""
        while True:
            self.beat()
            await asyncio.sleep(TICK_S)
