"""A producer dropped after failed sends is closed in the background until its close completes
(services/core/producer.py, ``discard``): kafka-python's close() raises while records are
pending, before it stops the sender thread, which then ran for good."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError

from services.core import producer as producer_module
from services.core.producer import discard


class Pending:
    """A producer whose close fails ``failures`` times (records pending), then completes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[float] = []
        self.closed = False

    def close(self, timeout: float | None = None) -> None:
        self.calls.append(cast(float, timeout))
        if len(self.calls) <= self.failures:
            raise KafkaTimeoutError("Timeout waiting for future")
        self.closed = True


def test_the_close_is_tried_again_until_it_completes() -> None:
    fake = Pending(failures=3)
    discard(cast(KafkaProducer, fake), 0.01).join(timeout=30)
    assert fake.closed
    assert fake.calls == [0.01] * 4  # each try waits wait_s inside the flush


def test_a_close_that_never_completes_is_given_up_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(producer_module, "DELIVERY_TIMEOUT_S", 0.0)
    fake: Any = Pending(failures=10**9)
    with caplog.at_level(logging.WARNING):
        discard(fake, 0.0).join(timeout=30)
    assert not fake.closed
    assert fake.calls  # tried at least once
    assert "a discarded producer did not close: KafkaTimeoutError" in caplog.text
