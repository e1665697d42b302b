"""A restricted caller's trigram grounding (services/retrieval/grounding.py ``fuzzy_matches``)
visits the candidate aliases best first and stops after a bounded number of visible ones; it
returns exactly what the one-statement form returns (every visible alias grouped and ranked),
over drawn tenants, ACLs, callers and misspelt names, with the bound as set and small enough
that the exact fallback runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from services.core.db.engine import make_engine
from services.retrieval import grounding
from tests.integration.test_graph_properties import _run
from tests.support.access import ACCESS, CALLERS, assign
from tests.support.graph import drop_database
from tests.support.query_fixtures import clone_database

pytestmark = pytest.mark.integration


async def _read(url: str) -> tuple[list[str], list[str]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            docs = (await conn.execute(text("SELECT doc_id FROM documents ORDER BY 1"))).all()
            names = (
                await conn.execute(text("SELECT DISTINCT alias FROM aliases ORDER BY 1"))
            ).all()
        return [str(r[0]) for r in docs], [str(r[0]) for r in names if len(str(r[0])) > 5]
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def fuzzy_db(sample_db: str) -> Iterator[tuple[str, list[str], list[str]]]:
    url = clone_database(sample_db, sample_db.rsplit("/", 1)[1])
    docs, names = _run(_read(url))
    yield url, docs, names
    drop_database(url)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), probes=st.sampled_from([grounding.FUZZY_PROBES, 2, 1]))
def test_best_first_fuzzy_grounding_equals_the_full_statement(
    fuzzy_db: tuple[str, list[str], list[str]], data: st.DataObject, probes: int
) -> None:
    url, docs, names = fuzzy_db
    access = {d: data.draw(ACCESS) for d in docs}
    caller = data.draw(CALLERS)
    name = data.draw(st.sampled_from(names))
    cut = data.draw(st.integers(0, len(name) - 1))
    spans = [name, name[:cut] + name[cut + 1 :], name.split()[0]]  # as said, misspelt, a part

    async def go() -> None:
        engine = make_engine(url)
        try:
            async with engine.begin() as conn:
                await assign(conn, access)
            async with engine.connect() as conn:
                for span in spans:
                    values: dict[str, Any] = {"s": span, "seeds": grounding.FUZZY_SEEDS}
                    every = await conn.execute(*grounding._FUZZY_EVERY.bind(caller, values))
                    expected = [(r[0], r[3]) for r in every.all()]
                    got = [(r[0], r[3]) for r in await grounding.fuzzy_matches(conn, span, caller)]
                    assert got == expected, span
        finally:
            await engine.dispose()

    saved = grounding.FUZZY_PROBES
    grounding.FUZZY_PROBES = probes
    try:
        _run(go())
    finally:
        grounding.FUZZY_PROBES = saved
