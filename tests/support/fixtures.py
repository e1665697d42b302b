"""Pytest fixtures from tests/support, registered by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.openai_stub import OpenAIStub


@pytest.fixture
def openai_stub() -> Iterator[OpenAIStub]:
    """A running OpenAI-compatible stub server on 127.0.0.1, fresh for each test."""
    stub = OpenAIStub().start()
    try:
        yield stub
    finally:
        stub.stop()
