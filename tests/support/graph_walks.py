"""A fixture that counts the local searches that walked the held graph."""

from __future__ import annotations

from typing import Any

import pytest

from services.retrieval import graph_walk


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many local searches walked the held graph (a spy on the real class)."""
    made: list[int] = []
    real = graph_walk.MemoryGraphReads.__init__

    def spy(self: graph_walk.MemoryGraphReads, *args: Any) -> None:
        made.append(1)
        real(self, *args)

    monkeypatch.setattr(graph_walk.MemoryGraphReads, "__init__", spy)
    return made
