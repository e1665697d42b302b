"""Where an event's time between publish and commit went, for freshness (docs/BENCHMARKS.md,
"Freshness"): the consecutive parts of published → committed, from wall-clock instants the
indexer already passes through. No clock is read here; the handlers and the agent take the
instants and this module only subtracts and formats them."""

from __future__ import annotations

import time
from dataclasses import dataclass

# In order: each part ends where the next begins, so they add up to published → committed.
PARTS = ("consumer", "batch", "compute", "queue", "write")


def wall_from_monotonic(instant: float, *, now_wall: float, now_monotonic: float) -> float:
    """A ``time.monotonic()`` instant as seconds since the epoch, given both clocks' "now"."""
    return now_wall - (now_monotonic - instant)


def received_wall(time_in: float | None) -> float | None:
    """When the consumer handed the record over (faust's monotonic ``Message.time_in``), as
    seconds since the epoch; None when faust did not stamp it."""
    if time_in is None:
        return None
    return wall_from_monotonic(time_in, now_wall=time.time(), now_monotonic=time.monotonic())


@dataclass(frozen=True)
class EventTimes:
    """Instants (seconds since the epoch) of one event on its way through the indexer:
    published (the Kafka record's timestamp), received (consumer fetch, faust's stamp), the
    batch's compute start and end, the batch's write start, and the event's commit."""

    published: float | None
    received: float | None
    compute_started: float
    compute_ended: float
    write_started: float
    committed: float

    def parts(self) -> dict[str, float]:
        """Seconds per part (PARTS order): consumer = published → received, batch = received →
        compute start (waiting for the batch to form and for the pipeline to take it), compute
        = the batch's compute phase, queue = compute end → write start (the previous batch's
        write), write = write start → this event's commit (the earlier events of its batch
        included). A part whose start is unknown is left out (and merged into the next)."""
        out: dict[str, float] = {}
        if self.published is not None and self.received is not None:
            out["consumer"] = self.received - self.published
        if self.received is not None:
            out["batch"] = self.compute_started - self.received
        out["compute"] = self.compute_ended - self.compute_started
        out["queue"] = self.write_started - self.compute_ended
        out["write"] = self.committed - self.write_started
        return out

    def describe(self) -> str:
        """The parts as one log-friendly string: ``consumer=0.012 batch=0.043 ...`` (seconds)."""
        return " ".join(f"{name}={seconds:.4f}" for name, seconds in self.parts().items())


def parse_parts(text: str) -> dict[str, float]:
    """The parts back from a ``describe()`` string found in ``text`` (unknown words ignored)."""
    out: dict[str, float] = {}
    for word in text.replace("(", " ").replace(")", " ").split():
        name, sep, value = word.partition("=")
        if sep and name in PARTS:
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out
