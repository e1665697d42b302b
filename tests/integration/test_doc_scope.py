"""The filters' predicate in SQL (``DOC_MATCHES`` with ``kgstream_doc_matches``, alembic 0022)
states the rule DocScope.admits states in Python, on the real database: drawn metadata (strings,
numbers, booleans, arrays, nested objects, dates in several spellings, malformed dates) and
drawn filters (values, any-of lists, number and time ranges, dotted paths, occurred_at
windows), each document judged by both."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from services.core.db.engine import make_engine
from services.core.doc_scope import ISO_TIME
from services.retrieval.filters import Filters
from services.retrieval.visibility import DOC_MATCHES

pytestmark = pytest.mark.integration

STRINGS = st.sampled_from(
    [
        "a",
        "The Verge",
        "2023-11-24",
        "2023-11-24T10:00:00+02:00",
        "2023-11-24 23:30",
        "2023-11-25T00:00:00Z",
        "2023-11-24T10:00:00.123456-05:00",
        "2023-02-30",
        "Nov 24 2023",
        "2023-11-24Z",
        "20231124",
        'say "hi"',  # quotes, a backslash, a tab and beyond the BMP in the jsonpath pre-filter
        "back\\slash\t",
        "Zürich 😀",
    ]
)
NUMBERS = st.one_of(st.integers(-3, 12), st.sampled_from([0.5, 2.5, 7.0, 1e3]))
SCALARS = st.one_of(STRINGS, NUMBERS, st.booleans())
VALUES = st.one_of(
    st.none(), SCALARS, st.lists(SCALARS, max_size=3), st.fixed_dictionaries({"x": SCALARS})
)
KEYS = ("source", "n", "when", "tags", "nested")
METADATA = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5)
DAY0 = datetime(2023, 11, 20, tzinfo=UTC)
OCCURRED = st.integers(0, 10 * 24 * 4).map(lambda q: DAY0 + timedelta(minutes=15 * q))
TIME_BOUNDS = st.sampled_from(
    ["2023-11-24", "2023-11-22T06:00:00Z", "2023-11-25T00:00:00+01:00", "2023-11-26 12:00"]
)
RANGES = st.one_of(
    st.dictionaries(st.sampled_from(["gte", "gt", "lte", "lt"]), NUMBERS, min_size=1),
    st.dictionaries(st.sampled_from(["gte", "gt", "lte", "lt"]), TIME_BOUNDS, min_size=1),
)
CONDITIONS = st.one_of(SCALARS, st.lists(SCALARS, min_size=1, max_size=3), RANGES)
FIELDS = st.sampled_from([*KEYS, "nested.x", "tags.0"])
FILTERS = st.fixed_dictionaries(
    {"metadata": st.dictionaries(FIELDS, CONDITIONS, max_size=3)},
    optional={
        "occurred_at": st.dictionaries(
            st.sampled_from(["gte", "gt", "lte", "lt"]), TIME_BOUNDS, min_size=1
        ),
        # The judged document states no time (no fact_times row): a window never admits it.
        "held": st.dictionaries(
            st.sampled_from(["gte", "gt", "lte", "lt"]), TIME_BOUNDS, min_size=1
        ),
    },
)
_JUDGE = text(
    "SELECT " + DOC_MATCHES + " FROM (SELECT CAST(:m AS jsonb) AS metadata,"  # noqa: S608 - a constant
    " CAST(:t AS timestamptz) AS occurred_at, 'judged' AS doc_id) d"
)


def _near(metadata: dict[str, Any], filters: dict[str, Any], pick: st.DataObject) -> None:
    """Give some of the filtered fields a value taken from the filter (one of its values, or a
    bound of its range): about the edge, where the two sides could disagree."""
    for field, cond in filters["metadata"].items():
        if pick.draw(st.booleans(), "near"):
            options = list(cond.values()) if isinstance(cond, dict) else cond
            value = pick.draw(st.sampled_from(options if isinstance(options, list) else [options]))
            head, *rest = field.split(".")
            if not rest:
                metadata[head] = value
            elif rest[0] == "0":
                metadata[head] = [value]
            else:
                metadata[head] = {rest[0]: value}


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    filters=FILTERS,
    docs=st.lists(st.tuples(METADATA, OCCURRED), min_size=1, max_size=8),
    pick=st.data(),
)
async def test_sql_and_python_agree(
    database_url: str,
    filters: dict[str, Any],
    docs: list[tuple[dict[str, Any], datetime]],
    pick: st.DataObject,
) -> None:
    scope = Filters.model_validate(filters).scope()
    if scope is None:
        return
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            for metadata, occurred in docs:
                _near(metadata, filters, pick)
                values = {"m": json.dumps(metadata), "t": occurred, **scope.params()}
                in_sql = bool(await conn.scalar(_JUDGE, values))
                admitted = scope.admits(metadata, occurred)
                event(f"admitted: {admitted}")
                assert in_sql == admitted, (metadata, occurred, scope)
    finally:
        await engine.dispose()


async def test_a_day_covers_the_whole_day(database_url: str) -> None:
    scope = Filters.model_validate(
        {"metadata": {"published": {"gte": "2023-11-24", "lte": "2023-11-24"}}}
    ).scope()
    assert scope is not None
    inside = ["2023-11-24", "2023-11-24T00:00:00Z", "2023-11-24T23:59:59.999999+00:00"]
    outside = ["2023-11-23T23:59:59Z", "2023-11-25T00:00:00Z", "2023-11-24T23:00:00-05:00"]
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            for value, expected in [(v, True) for v in inside] + [(v, False) for v in outside]:
                values = {"m": json.dumps({"published": value}), "t": DAY0, **scope.params()}
                assert bool(await conn.scalar(_JUDGE, values)) is expected, value
                assert scope.admits({"published": value}, DAY0) is expected, value
    finally:
        await engine.dispose()


async def test_the_postgresql_15_time_check_reads_as_the_16_one(database_url: str) -> None:
    """alembic 0022 installs kgstream_valid_time as pg_input_is_valid (16+) or as an exception
    block (15): the second, installed here under another name, judges as the first."""
    path = Path(__file__).parents[2] / "alembic" / "versions" / "0022_document_filters.py"
    spec = importlib.util.spec_from_file_location("migration_0022", path)
    assert spec is not None
    assert spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert ISO_TIME.pattern == migration.ISO_TIME  # the two sides read the same spellings
    engine = make_engine(database_url)
    samples = ["2023-11-24", "2023-02-30", "2023-11-24T25:00", "2023-11-24T10:00:00+02:00", "x"]
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(migration.VALID_TIME[False].replace("kgstream_valid_time", "pg15_valid_time"))
            )
            for s in samples:
                got = await conn.scalar(text("SELECT pg15_valid_time(:s)"), {"s": s})
                want = await conn.scalar(text("SELECT kgstream_valid_time(:s)"), {"s": s})
                assert got == want, s
            await conn.execute(text("DROP FUNCTION pg15_valid_time(text)"))
    finally:
        await engine.dispose()


async def test_times_read_alike_in_any_session_time_zone(database_url: str) -> None:
    """A date or a time without an offset is UTC whatever the session's time zone; a bound
    with an offset PostgreSQL would refuse (+16:00) is sent in UTC."""
    scope = Filters.model_validate(
        {"metadata": {"p": {"gte": "2023-11-24T10:00+16:00", "lt": "2023-11-24T04:00:00Z"}}}
    ).scope()
    assert scope is not None
    samples = ["2023-11-24", "2023-11-23T18:00", "2023-11-24T03:59:59Z", "2023-11-23 17:59"]
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            for zone in ("UTC", "America/New_York", "Asia/Kolkata"):
                await conn.execute(text(f"SET TimeZone = '{zone}'"))
                for value in samples:
                    values = {"m": json.dumps({"p": value}), "t": DAY0, **scope.params()}
                    in_sql = bool(await conn.scalar(_JUDGE, values))
                    assert in_sql == scope.admits({"p": value}, DAY0), (zone, value)
    finally:
        await engine.dispose()
