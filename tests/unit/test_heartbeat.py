"""The main loop's heartbeat (services/query_api/heartbeat.py): the probes' stall rule."""

from __future__ import annotations

from services.query_api.heartbeat import Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stalled_only_beyond_the_limit_and_fresh_after_a_beat() -> None:
    clock = Clock()
    heart = Heartbeat(15.0, clock)
    assert heart.stalled_for() is None  # fresh from the start
    clock.now += 15.0
    assert heart.stalled_for() is None  # at the limit: not yet
    clock.now += 0.5
    assert heart.stalled_for() == 15.5
    heart.beat()
    assert heart.stalled_for() is None
