"""Many rows in one statement: ``INSERT ... SELECT FROM unnest(array, array, ...)``.

One statement per table instead of one per row: the server parses, plans and runs it once, and
the client binds one array per column instead of a dict per row (the per-row executemany cost
205 statements per document on the ingest path; see docs/BENCHMARKS.md, deliverable 8)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class BulkInsert:
    """An INSERT of ``columns`` (name, SQL type) into ``table``, then ``tail`` (ON CONFLICT ...).
    Rows go in in the order given."""

    table: str
    columns: tuple[tuple[str, str], ...]
    tail: str = ""

    def statement(self) -> TextClause:
        names = ", ".join(name for name, _ in self.columns)
        arrays = ", ".join(f"CAST(:c{i} AS {kind}[])" for i, (_, kind) in enumerate(self.columns))
        sql = f"INSERT INTO {self.table} ({names}) SELECT * FROM unnest({arrays}) {self.tail}"  # noqa: S608 - table, columns and tail are the caller's constants
        return text(sql)


async def insert_rows(
    conn: AsyncConnection, insert: BulkInsert, rows: Sequence[Sequence[object]]
) -> None:
    """Insert ``rows`` (tuples in ``insert.columns`` order) with one statement; none is a no-op."""
    if rows:
        await conn.execute(insert.statement(), bind(insert, rows))


def bind(insert: BulkInsert, rows: Sequence[Sequence[object]]) -> dict[str, list[object]]:
    """The statement's parameters (one array per column) for ``rows``, for callers that embed
    ``insert.statement()`` in a larger one."""
    width = len(insert.columns)
    if any(len(row) != width for row in rows):
        raise ValueError(f"{insert.table}: every row needs {width} values")
    return {f"c{i}": [row[i] for row in rows] for i in range(width)}
