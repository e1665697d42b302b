"""What the indexer's handlers report while they work (docs/metrics.md, "Indexer"), as a
framework-free interface: the handlers call an ``IndexerObserver`` from their IndexerDeps; the
composition root passes the Prometheus one (services/indexer/metrics.py), tests and the eval
get ``NO_OBSERVER``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from services.core.clocks import occurred_plausibly
from services.core.model_meter import ModelMeter

if TYPE_CHECKING:
    from services.indexer.deps import Outcome

Stage = Literal["decode", "chunk", "embed", "extract", "resolve", "write"]
Since = Literal["occurred", "published"]


class IndexerObserver(ModelMeter):
    """Receives the indexer's figures; every method returns at once and never raises."""

    def batch(self, size: int) -> None:
        """A batch of ``size`` records was handed to the handler."""

    def outcome(self, outcome: Outcome) -> None:
        """One record ended in ``outcome``."""

    def dead_letter(self, reason: str) -> None:
        """One record was dead-lettered for ``reason``."""

    def stage(self, stage: Stage, seconds: float) -> None:
        """A batch spent ``seconds`` in ``stage``."""

    def freshness(self, since: Since, seconds: float) -> None:
        """An event committed ``seconds`` after it occurred, or after it was published."""

    def chunks(self, reused: int, embedded: int) -> None:
        """A new document version kept ``reused`` chunks and embedded ``embedded`` anew."""

    def transient_retry(self) -> None:
        """A batch held by a transient failure is retried."""


NO_OBSERVER = IndexerObserver()


@contextmanager
def timed(observer: IndexerObserver, stage: Stage) -> Iterator[None]:
    """Report the time spent in the block as ``stage`` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        observer.stage(stage, time.perf_counter() - start)


def observe_freshness(
    observer: IndexerObserver, occurred_at: datetime, published: float | None, now: float
) -> None:
    """Report an event committed at ``now`` (seconds since the epoch): since its occurred_at,
    and since its record's timestamp ``published``. An implausible occurred_at (a back-fill,
    a broken clock; ``occurred_plausibly``, the rule of the status's figures) is left out of
    the first: one year-0001 event would put the histogram's tail at billions of seconds."""
    stamped = published if published is not None and published > 0 else now
    reference = datetime.fromtimestamp(stamped, UTC)
    if occurred_plausibly(occurred_at, reference):
        observer.freshness("occurred", max(0.0, now - occurred_at.timestamp()))
    if published is not None:
        observer.freshness("published", max(0.0, now - published))
