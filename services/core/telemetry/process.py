"""A process's operations lifecycle: build info and pool metrics, its HTTP server (workers),
its row in the processes table with a heartbeat, and refreshes of metrics that are read
rather than counted (consumer lag, snapshot state), run at the heartbeat's pace."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from services.core import processes
from services.core.telemetry.build import record_build
from services.core.telemetry.pool import watch_pool
from services.core.telemetry.server import OpsServer

log = logging.getLogger(__name__)
Refresh = Callable[[], Awaitable[None]]
STOP_TIMEOUT_S = 5.0


class ProcessOps:
    """Start with ``start()``, stop with ``stop()`` (both on the process's event loop)."""

    def __init__(
        self,
        engine: AsyncEngine,
        name: str,
        *,
        server: OpsServer | None = None,
        metrics_url: str | None = None,
        refresh: Sequence[Refresh] = (),
        interval_s: float = processes.HEARTBEAT_S,
    ) -> None:
        self.engine, self.name, self.server = engine, name, server
        self.metrics_url = metrics_url  # for a process that serves /metrics itself
        self.refresh, self.interval_s = list(refresh), interval_s
        self._row: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str | None:
        """Serve, register, start beating; returns the metrics URL."""
        record_build(self.name)
        watch_pool(self.engine)
        if self.server is not None:
            self.metrics_url = f"{await self.server.start()}/metrics"
            log.info("%s metrics on %s", self.name, self.metrics_url)
        await self._register()
        self._task = asyncio.create_task(self._beat(), name=f"{self.name}-heartbeat")
        return self.metrics_url

    async def stop(self) -> None:
        """Stop beating, delete the row, stop serving."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._row is not None:
            try:
                await asyncio.wait_for(processes.deregister(self.engine, self._row), STOP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the row goes stale on its own
                log.info("could not deregister %s: %s: %s", self.name, type(exc).__name__, exc)
        if self.server is not None:
            await self.server.stop()

    async def _register(self) -> None:
        try:
            self._row = await processes.register(self.engine, self.name, self.metrics_url)
        except Exception as exc:  # noqa: BLE001 - retried at the next beat
            log.warning("could not register %s: %s: %s", self.name, type(exc).__name__, exc)

    async def _beat(self) -> None:
        while True:
            for refresh in self.refresh:
                try:
                    await refresh()
                except Exception as exc:  # noqa: BLE001 - observational: never stop the beat
                    log.info("metrics refresh failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.interval_s)
            try:
                alive = self._row is not None and await processes.heartbeat(self.engine, self._row)
            except Exception as exc:  # noqa: BLE001 - the database may come back
                log.info("heartbeat of %s failed: %s: %s", self.name, type(exc).__name__, exc)
                continue
            if not alive:
                await self._register()
