"""What the read router reports about its reads (services/retrieval/replicas.py and
replica_monitor.py): which database each read went to, the fallbacks to the primary, the
waits for ``min_snapshot`` / ``after_event``, and each replica's measured lag. The engine
reports; the process decides where it goes (the query API: Prometheus, services/query_api/
metrics.py). As the workers' observers do (services/indexer/observer.py)."""

from __future__ import annotations

from typing import Protocol


class ReadObserver(Protocol):
    """Receives the read router's events; every method must be cheap and never raise."""

    def read(self, target: str) -> None:
        """A read went to ``target`` (``primary`` or a replica's name)."""

    def fallback(self, reason: str) -> None:
        """A read fell back to the primary (``not_caught_up`` | ``no_usable_replica``)."""

    def waiting(self, target: str, delta: int) -> None:
        """A read started (+1) or stopped (-1) waiting on ``target`` to show what it wants."""

    def waited(self, outcome: str, seconds: float) -> None:
        """A read that wanted a state waited this long (``met`` | ``refused``)."""

    def replica(
        self, name: str, *, usable: bool, lag_bytes: float | None, lag_s: float | None
    ) -> None:
        """A replica was measured: usable or not, its lag (None: unknown)."""


class NoReadObserver:
    """Reports nothing (the CLI, the eval, tests)."""

    def read(self, target: str) -> None:
        pass

    def fallback(self, reason: str) -> None:
        pass

    def waiting(self, target: str, delta: int) -> None:
        pass

    def waited(self, outcome: str, seconds: float) -> None:
        pass

    def replica(
        self, name: str, *, usable: bool, lag_bytes: float | None, lag_s: float | None
    ) -> None:
        pass


NO_READ_OBSERVER: ReadObserver = NoReadObserver()
