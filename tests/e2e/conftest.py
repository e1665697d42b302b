"""End-to-end fixtures: a user's home whose embedded database is deleted afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.core.infra.postgres import EmbeddedPostgres


@pytest.fixture
def user_home(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path / "home"`` for KGSTREAM_HOME. As root the embedded PostgreSQL keeps its data
    under /var/tmp, which removing tmp_path does not clean: it is purged here."""
    home = tmp_path / "home"
    yield home
    EmbeddedPostgres(home).purge()
