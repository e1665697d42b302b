"""``as_of`` (issue 31, step 4): vector mode reads the documents as they were at a past time
by their own clock (services/retrieval/as_of.py), from the history the indexer keeps
(services/indexer/graph_store/history.py, alembic 0025).

The property: after any sequence of upserts, deletes, replays and stale events, a query as of
a time ``t`` returns what the same query returns from an index built from scratch from the
events that had taken effect by ``t`` (the topic cut at ``t``): the same passages, the same
scores. Beside it, the rules the property's corpus cannot draw: who may read a past version
(as now), what is refused, and pruning."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import text

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.settings import Settings
from services.indexer.graph_store.history import prune
from services.retrieval.as_of import HistoryNotKept, past_reads
from services.retrieval.lexical import StatsCache, bm25_search
from services.retrieval.schemas import QueryRequest, QueryResponse
from services.retrieval.service import build_query_service
from services.retrieval.vector import CURRENT, load_chunks, vector_search
from tests.integration.test_graph_properties import (
    KEPT_CHUNKS_MOVE,
    TOMBSTONE_HOLDS,
    Step,
    _other,
    _run,
    _up,
    plan,
    scenarios,
)
from tests.support.graph import apply_events, create_database, drop_database
from tests.support.property_corpus import DOC_IDS, T0, Env

pytestmark = pytest.mark.integration

QUESTIONS = ("Who founded Microsoft?", "What happened in Germany and Paris?")
DELETE_THEN_BACK = [
    _up("london", 0),
    _up("seattle", 0),
    _other("delete", "london"),
    _up("london", 1, 3),
    _up("seattle", 1, None),
]


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["occurred_at"]))


def cut(
    sent: Sequence[dict[str, Any]], outcomes: Sequence[str], t: datetime
) -> list[dict[str, Any]]:
    """The events an index built from the topic cut at ``t`` holds: each document's state
    after the last change that had taken effect by ``t``. A change takes effect at its
    event's time, or at its document's previous change if that is later (a delete without a
    version applies whatever its time: it cannot undo what came before it)."""
    state: dict[str, tuple[datetime, dict[str, Any] | None]] = {}
    for event, outcome in zip(sent, outcomes, strict=True):
        if outcome not in ("applied", "deleted"):
            continue
        doc = str(event["doc_id"])
        effective = max(_at(event), state[doc][0]) if doc in state else _at(event)
        if effective <= t:
            state[doc] = (effective, event if outcome == "applied" else None)
    return [
        dict(e, event_id=f"cut-{e['event_id']}")
        for d in DOC_IDS
        if d in state and (e := state[d][1]) is not None
    ]


async def _ask(url: str, env: Env, request: QueryRequest, caller: Caller) -> QueryResponse:
    engine = make_engine(url)
    try:
        service = build_query_service(
            Settings(database_url=url), engine, env.embedder, env.extractor, env.pool
        )
        return await service.query(request, caller, answer=False)
    finally:
        await engine.dispose()


async def _rankings(url: str, env: Env, question: str, as_of: datetime | None) -> dict[str, Any]:
    """What vector mode ranks, as comparable data (ids differ between databases): the dense
    and the BM25 scores of every passage, each with its text, and the passages it returns
    (k covers the corpus). Ties in either ranking are broken by chunk id, which differs
    between the two databases, so the fused order of tied passages may too: their scores
    and the passages returned may not."""
    engine = make_engine(url)
    caller = Caller.operator()
    embedding = env.embedder.embed([question])[0]
    try:
        async with engine.connect() as conn:
            if as_of is None:
                reads, stats = CURRENT, await StatsCache().get(conn)
            else:
                reads, stats = await past_reads(conn, as_of)
            dense = await vector_search(conn, embedding, 50, caller=caller, reads=reads)
            bm25 = await bm25_search(
                conn, question, 50, stats, caller=caller, statement=reads.bm25, values=reads.values
            )
            texts = await load_chunks(conn, list(bm25), caller=caller, reads=reads)
    finally:
        await engine.dispose()
    request = QueryRequest(question=question, mode="vector", k=50, as_of=as_of)
    response = await _ask(url, env, request, caller)
    return {
        "dense": sorted((round(c.score, 6), c.text) for c in dense),
        "bm25": sorted((round(score, 6), texts[c].text) for c, score in bm25.items()),
        "returned": sorted(c.text for c in response.contexts),
        "mode": response.mode_used,
    }


@settings(
    max_examples=int(os.environ.get("KGSTREAM_PROPERTY_EXAMPLES", "10")),
    deadline=None,
    print_blob=True,
)
@given(steps=scenarios(), minute=st.integers(0, 14), batch_size=st.sampled_from([1, 12]))
@example(steps=KEPT_CHUNKS_MOVE, minute=1, batch_size=1)
@example(steps=TOMBSTONE_HOLDS, minute=2, batch_size=1)
@example(steps=TOMBSTONE_HOLDS, minute=6, batch_size=12)
@example(steps=DELETE_THEN_BACK, minute=3, batch_size=1)
def test_as_of_equals_a_rebuild_from_the_cut(
    env: Env, steps: list[Step], minute: int, batch_size: int
) -> None:
    planned = plan(steps)
    t = T0 + timedelta(minutes=minute, seconds=30)  # between two events' times
    live, rebuilt = create_database(env.server_url), create_database(env.server_url)
    try:
        outcomes = _run(env.build(live, planned.sent, batch_size))
        _run(env.build(rebuilt, cut(planned.sent, outcomes, t)))
        for question in QUESTIONS:
            got = _run(_rankings(live, env, question, t))
            assert got == _run(_rankings(rebuilt, env, question, None)), (question, t)
            assert got["mode"] == "vector"
    finally:
        drop_database(live)
        drop_database(rebuilt)


def _event(n: int, doc: str, kind: str, minute: int, **fields: Any) -> dict[str, Any]:
    event = {
        "event_id": f"acl-{n}",
        "type": kind,
        "doc_id": doc,
        "occurred_at": (T0 + timedelta(minutes=minute)).isoformat(),
    }
    return event | fields


ACL_EVENTS = [
    _event(1, "memo", "upsert", 1, title="Memo", text="The depot in Lyon opened in spring.",
           acl=["ops", "sales"], metadata={"source": "Wire"}),
    _event(2, "memo", "upsert", 3, title="Memo", text="The depot in Lyon closed in autumn.",
           acl=["ops"], metadata={"source": "Post"}),
    _event(3, "note", "upsert", 1, title="Note", text="Lyon hosts the annual depot fair.",
           acl=["sales"]),
    _event(4, "note", "delete", 5),
]  # fmt: skip


@pytest.fixture
async def acl_db(env: Env) -> AsyncIterator[str]:
    url = create_database(env.server_url)
    await env.build(url, ACL_EVENTS)
    yield url
    drop_database(url)


async def _texts(url: str, env: Env, minute: float | None, caller: Caller, **more: Any) -> set[str]:
    as_of = None if minute is None else T0 + timedelta(minutes=minute)
    request = QueryRequest(question="Lyon depot", mode="vector", k=10, as_of=as_of, **more)
    contexts = (await _ask(url, env, request, caller)).contexts
    return {c.text.split("\n\n")[-1] for c in contexts}  # without the title's lead-in


OPENED, CLOSED = "The depot in Lyon opened in spring.", "The depot in Lyon closed in autumn."
FAIR = "Lyon hosts the annual depot fair."


async def test_a_past_version_is_read_under_todays_access_rule(acl_db: str, env: Env) -> None:
    ops, sales = Caller(groups=frozenset({"ops"})), Caller(groups=frozenset({"sales"}))
    assert await _texts(acl_db, env, 2, Caller.operator()) == {OPENED, FAIR}
    assert await _texts(acl_db, env, 4, Caller.operator()) == {CLOSED, FAIR}
    assert await _texts(acl_db, env, 6, Caller.operator()) == {CLOSED}
    assert await _texts(acl_db, env, None, Caller.operator()) == {CLOSED}
    assert await _texts(acl_db, env, 0.5, Caller.operator()) == set()  # before anything
    # The memo's first version was shared with sales; today it is not: sales never sees it.
    assert await _texts(acl_db, env, 2, ops) == {OPENED}
    assert await _texts(acl_db, env, 2, sales) == {FAIR}  # the note, deleted since
    assert await _texts(acl_db, env, 6, sales) == set()
    # Filters read the metadata of the version that held.
    wire = {"filters": {"metadata": {"source": "Wire"}}}
    assert await _texts(acl_db, env, 2, Caller.operator(), **wire) == {OPENED}
    assert await _texts(acl_db, env, 4, Caller.operator(), **wire) == set()


async def test_as_of_is_refused_where_it_cannot_answer(acl_db: str, env: Env) -> None:
    at = T0 + timedelta(minutes=2)
    for mode in ("local", "global", "path"):
        with pytest.raises(ValidationError, match="as_of answers from passages"):
            QueryRequest(question="Lyon", mode=mode, as_of=at)
    with pytest.raises(ValidationError, match=r"filters\.held"):
        QueryRequest.model_validate(
            {"question": "Lyon", "as_of": at, "filters": {"held": {"gte": "2020-01-01"}}}
        )
    with pytest.raises(ValidationError, match="timezone"):
        QueryRequest(question="Lyon", as_of=datetime(2024, 1, 1))  # noqa: DTZ001 - the point
    engine = make_engine(acl_db)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE history_horizon SET kept_since = :t"), {"t": T0 + timedelta(minutes=3)}
            )
        with pytest.raises(HistoryNotKept, match="history is kept from"):
            await _texts(acl_db, env, 2, Caller.operator())
        assert await _texts(acl_db, env, 4, Caller.operator()) == {CLOSED, FAIR}
        # Keeping nothing: the history is forgotten and every as_of refused.
        async with engine.begin() as conn:
            await prune(conn, 0)
            kept = await conn.scalar(text("SELECT count(*) FROM chunk_history"))
            versions = await conn.scalar(text("SELECT count(*) FROM document_versions"))
        assert (kept, versions) == (0, 0)
        with pytest.raises(HistoryNotKept, match="no history is kept"):
            await _texts(acl_db, env, 6, Caller.operator())
        assert await _texts(acl_db, env, None, Caller.operator()) == {CLOSED}
    finally:
        await engine.dispose()


async def test_pruning_keeps_what_the_retention_covers(acl_db: str) -> None:
    engine = make_engine(acl_db)
    try:
        async with engine.begin() as conn:
            before = await conn.scalar(text("SELECT count(*) FROM chunk_history"))
            # Replaced in 2024: older than any retention counted from now.
            await prune(conn, 36500)
            kept = await conn.scalar(text("SELECT count(*) FROM chunk_history"))
            await prune(conn, 7)
            after = await conn.scalar(text("SELECT count(*) FROM chunk_history"))
            late = await conn.scalar(
                text("SELECT now() - interval '7 days' - kept_since FROM history_horizon")
            )
        assert before == kept == 2  # the memo's first version, the deleted note
        assert after == 0
        assert abs(late.total_seconds()) < 60  # kept from a week ago
    finally:
        await engine.dispose()


def test_history_off_writes_nothing(env: Env) -> None:
    url = create_database(env.server_url)
    try:
        _run(_build_without_history(env, url))
        engine = make_engine(url)

        async def count() -> int:
            async with engine.connect() as conn:
                n = await conn.scalar(
                    text(
                        "SELECT (SELECT count(*) FROM chunk_history)"
                        " + (SELECT count(*) FROM document_versions)"
                    )
                )
            await engine.dispose()
            return int(n or 0)

        assert _run(count()) == 0
    finally:
        drop_database(url)


async def _build_without_history(env: Env, url: str) -> None:
    async with env.deps(url) as deps:
        await apply_events(replace(deps, history_days=0.0), ACL_EVENTS, 1)
