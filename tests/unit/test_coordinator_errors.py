"""services/indexer/coordinator_errors.py on a fake aiokafka coordinator."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaError

from services.indexer.coordinator_errors import surface_errors


class FakeCoordinator:
    """Parks one error like aiokafka's ``_push_error_to_user`` until ``check_errors()``."""

    def __init__(self) -> None:
        self._pending_exception: KafkaError | None = KafkaError("assignment failed")
        self._coordination_task = SimpleNamespace(done=lambda: False)
        self.checked = 0

    def check_errors(self) -> None:
        self.checked += 1
        exc, self._pending_exception = self._pending_exception, None
        if exc is not None:
            raise exc


async def test_a_parked_error_is_read_once_so_coordination_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator = FakeCoordinator()
    task = asyncio.create_task(surface_errors(SimpleNamespace(_coordinator=coordinator), 0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert coordinator._pending_exception is None
    assert coordinator.checked == 1  # only while an error is parked
    assert "consumer group coordination failed" in caplog.text
    coordinator._coordination_task = SimpleNamespace(done=lambda: True)
    await asyncio.wait_for(task, 5)  # ends once coordination itself has stopped
    assert "cannot rejoin" in caplog.text
