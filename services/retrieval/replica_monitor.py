"""The replicas the query API may read from and the measuring of their lag (issue 20): every
KGSTREAM_READ_REPLICA_CHECK_S, on an event loop and connections of its own (a query flood
neither delays the checks nor takes their connections), the primary's WAL position and each
replica's replay position (services/core/replication.py). Each check is answered within the
readiness budget: a replica that does not answer is recorded as such at once, its check left
in flight (one at a time, services/core/deadline.py), so /readyz reports it without waiting.
The router (replicas.py) reads what the checks recorded."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.db.engine import DbTimeouts, make_engine
from services.core.deadline import BackgroundLoop, DeadlineExceeded, SingleFlight
from services.core.replication import (
    ReplicaLag,
    describe_error,
    lag_of,
    primary_position,
    replica_position,
)
from services.core.settings import Settings
from services.retrieval.read_observer import NO_READ_OBSERVER, ReadObserver


@dataclass(frozen=True)
class ReadPolicy:
    """The KGSTREAM_READ_* settings (and the readiness budget, which bounds each check)."""

    fallback: Literal["primary", "unavailable"] = "primary"
    max_lag_s: float = 3.0
    wait_max_s: float = 3.0
    check_s: float = 1.0
    retry_s: float = 5.0
    check_budget_s: float = 0.8
    connect_s: int = 5

    @classmethod
    def from_settings(cls, settings: Settings) -> ReadPolicy:
        """The configured policy."""
        return cls(
            fallback=settings.read_fallback,
            max_lag_s=settings.read_max_lag_s,
            wait_max_s=settings.read_wait_max_s,
            check_s=settings.read_replica_check_s,
            retry_s=settings.read_replica_retry_s,
            check_budget_s=settings.readiness_budget_s,
            connect_s=settings.db_connect_timeout_s,
        )


class Replica:
    """One replica: its URL, the API's pool on it (``engine``, used on the API's loop) and its
    state. ``checked`` (lag, when) is written by the monitor's thread, ``out`` (left out until,
    why) by the monitor or a reader: each is one tuple assignment, read whole."""

    def __init__(self, name: str, url: str, engine: AsyncEngine) -> None:
        self.name, self.url, self.engine = name, url, engine
        self.checked: tuple[ReplicaLag | None, float] = (None, 0.0)  # (lag, monotonic time)
        self.out: tuple[float, str] = (0.0, "")  # (left out until, why)

    @property
    def database(self) -> str:
        """The URL with the password masked."""
        return self.engine.url.render_as_string(hide_password=True)

    def usable(self, now: float, policy: ReadPolicy) -> bool:
        """Checked without error since it was last taken out, recently, and close enough."""
        lag, at = self.checked
        fresh = now - at <= 2 * policy.check_s + policy.check_budget_s
        return (
            lag is not None
            and not lag.error
            and fresh
            and at >= self.out[0]
            and lag.lag_s is not None
            and lag.lag_s <= policy.max_lag_s
        )

    def take_out(self, error: str, retry_s: float) -> None:
        """Leave it out of reads for ``retry_s`` (a failed connect, a lost connection, a
        failed check); the first good check after that puts it back."""
        self.out = (time.monotonic() + retry_s, error)

    def report(self, now: float, policy: ReadPolicy) -> dict[str, Any]:
        """Its lag and state for status and /readyz."""
        lag, at = self.checked
        out_until, why = self.out
        doc = (lag or ReplicaLag(self.name, self.database, error="not checked yet")).to_dict()
        doc["usable"] = self.usable(now, policy)
        doc["checked_s_ago"] = None if lag is None else round(now - at, 3)
        doc["out_for_s"] = round(max(0.0, out_until - now), 3)
        if not doc["error"] and out_until > at:
            doc["error"] = why  # taken out by a reader since the last check
        return doc


class ReplicaMonitor:
    """Measures the replicas' lag in the background; ``start`` once, ``stop`` at the end."""

    def __init__(
        self,
        primary_url: str,
        replicas: Sequence[Replica],
        policy: ReadPolicy,
        observer: ReadObserver = NO_READ_OBSERVER,
    ) -> None:
        self._primary_url, self._replicas, self._policy = primary_url, replicas, policy
        self._observer = observer
        self._loop = BackgroundLoop("kgstream-replicas")
        self._running: Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._engines: list[AsyncEngine] = []
        # (time asked, WAL position) of the primary's last readings: how long ago it was where
        # a replica is (services/core/replication.py). 600 cover 10 minutes at 1 s a check.
        self._readings: deque[tuple[float, int]] = deque(maxlen=600)

    def start(self) -> None:
        """Begin checking (idempotent)."""
        if self._running is None:
            self._running = self._loop.submit(self._run())

    def stop(self) -> None:
        """Stop checking and close the monitor's connections (bounded; blocking)."""
        self._loop.stop(self._shutdown())

    async def _shutdown(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._running is not None:
            await asyncio.wait({asyncio.wrap_future(self._running)}, timeout=self._policy.connect_s)
        for engine in self._engines:
            await engine.dispose()

    async def _run(self) -> None:
        policy = self._policy
        self._stop = asyncio.Event()
        timeouts = DbTimeouts(connect_s=policy.connect_s, statement_s=policy.check_budget_s)

        def engine(url: str) -> AsyncEngine:
            made = make_engine(url, pool_size=1, max_overflow=1, timeouts=timeouts)
            self._engines.append(made)
            return made

        give_up = policy.connect_s + policy.check_budget_s
        primary = engine(self._primary_url)
        primary_check = SingleFlight(
            lambda: _primary_lsn(primary), policy.check_budget_s, give_up, "the primary"
        )
        checks = [
            (r, SingleFlight(_position_of(engine(r.url)), policy.check_budget_s, give_up, r.name))
            for r in self._replicas
        ]
        while not self._stop.is_set():
            primary_lsn: int | None = None
            try:
                reading: tuple[float, int] = await primary_check()
                self._readings.append(reading)
                primary_lsn = reading[1]
            except Exception:  # noqa: BLE001 - replicas are measured without it (bytes unknown)
                primary_lsn = None
            await asyncio.gather(*(self._check(r, c, primary_lsn) for r, c in checks))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), policy.check_s)

    async def _check(
        self, replica: Replica, check: SingleFlight[Any], primary_lsn: int | None
    ) -> None:
        if time.monotonic() < replica.out[0]:
            return  # taken out: checked again once its time is up
        try:
            position = await check()
        except DeadlineExceeded as exc:
            lag = ReplicaLag(replica.name, replica.database, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - recorded: the replica is left out
            lag = ReplicaLag(replica.name, replica.database, error=describe_error(exc))
        else:
            reached = self._reached_s(position.replay_lsn)
            lag = lag_of(replica.name, replica.database, position, primary_lsn, reached)
        replica.checked = (lag, time.monotonic())
        if lag.error:
            replica.take_out(lag.error, self._policy.retry_s)
        usable = replica.usable(time.monotonic(), self._policy)
        self._observer.replica(
            replica.name, usable=usable, lag_bytes=lag.lag_bytes, lag_s=lag.lag_s
        )

    def _reached_s(self, replay_lsn: int | None) -> float | None:
        """Seconds since the newest reading of the primary at or before ``replay_lsn``."""
        if replay_lsn is None:
            return None
        for asked_at, lsn in reversed(self._readings):
            if lsn <= replay_lsn:
                return time.monotonic() - asked_at
        return None


async def _primary_lsn(engine: AsyncEngine) -> tuple[float, int]:
    """(when it was asked, the primary's WAL position): the position is the primary's at or
    after that time, so it was at most there then."""
    asked_at = time.monotonic()
    async with engine.connect() as conn:
        return asked_at, await primary_position(conn)


def _position_of(engine: AsyncEngine) -> Any:
    async def read() -> Any:
        async with engine.connect() as conn:
            return await replica_position(conn)

    return read
