"""The one-statement bulk INSERT: its SQL and its refusal of ragged rows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.core.db.bulk import BulkInsert, insert_rows

PAIRS = BulkInsert("pairs", (("a", "bigint"), ("b", "text")), "ON CONFLICT DO NOTHING")


class _Recorder:
    """Stands in for an AsyncConnection: records what would be executed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def execute(self, statement: Any, params: dict[str, Any]) -> None:
        self.calls.append((str(statement), params))


def test_statement_unnests_one_array_per_column() -> None:
    assert str(PAIRS.statement()) == (
        "INSERT INTO pairs (a, b) SELECT * FROM unnest(CAST(:c0 AS bigint[]),"
        " CAST(:c1 AS text[])) ON CONFLICT DO NOTHING"
    )


def test_rows_become_column_arrays_in_order() -> None:
    conn = _Recorder()
    asyncio.run(insert_rows(conn, PAIRS, [(2, "x"), (1, "y")]))  # type: ignore[arg-type]
    assert conn.calls == [(str(PAIRS.statement()), {"c0": [2, 1], "c1": ["x", "y"]})]


def test_no_rows_no_statement() -> None:
    conn = _Recorder()
    asyncio.run(insert_rows(conn, PAIRS, []))  # type: ignore[arg-type]
    assert conn.calls == []


def test_ragged_row_is_refused() -> None:
    conn = _Recorder()
    with pytest.raises(ValueError, match="pairs: every row needs 2 values"):
        asyncio.run(insert_rows(conn, PAIRS, [(1, "x"), (2,)]))  # type: ignore[arg-type]
    assert conn.calls == []
