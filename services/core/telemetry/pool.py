"""``kgstream_db_pool_connections``: the SQLAlchemy pool of the process, read at scrape."""

from __future__ import annotations

import weakref
from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

NAME = "kgstream_db_pool_connections"


class PoolCollector(Collector):
    """Connections in use and idle, summed over the engines it watches."""

    def __init__(self) -> None:
        self._engines: weakref.WeakSet[AsyncEngine] = weakref.WeakSet()

    def watch(self, engine: AsyncEngine) -> None:
        """Count this engine's pool from now on (until it is garbage-collected)."""
        self._engines.add(engine)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The one family, without reading any pool."""
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The pools as they are now."""
        in_use = idle = 0
        for engine in list(self._engines):
            pool = engine.sync_engine.pool
            if isinstance(pool, QueuePool):
                in_use += pool.checkedout()
                idle += pool.checkedin()
        family = self._family()
        family.add_metric(["in_use"], in_use)
        family.add_metric(["idle"], idle)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            NAME, "Database connections of this process's pool, by state", labels=["state"]
        )


POOL = PoolCollector()
REGISTRY.register(POOL)


def watch_pool(engine: AsyncEngine) -> None:
    """Export ``engine``'s pool (composition roots call this once per engine)."""
    POOL.watch(engine)
