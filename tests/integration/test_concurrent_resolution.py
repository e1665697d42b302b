"""Two indexers resolving the same name at the same time build the graph one indexer builds.
A title (an entity of any type) and a typed mention of it in another document, written by two
transactions at once, used to become two entities: each inserted its own (key, type group) and
neither could see the other's. That made test_two_indexers' "equals a clean run" flaky (CI,
stop 12). Entity creation now waits for the transaction that holds the name's creation lock."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, handle_record
from tests.support.records import document_event, record, rows

pytestmark = pytest.mark.integration

# A title is an entity of any type; a typed mention of the same name in another document is
# the same entity (one indexer narrows the title's entity to the mention's type). HotpotQA's
# bridge entities are exactly this: one passage's title named in another passage.
FIRST = document_event(
    event_id="a1", doc_id="ms-a", title="Redmond", text="The city lies east of Lake Washington."
)
SECOND = document_event(
    event_id="b1",
    doc_id="ms-b",
    title="Company notes",
    text="Microsoft Corporation is based in Redmond.",
)
HOLD_S = 3


def hold_first_transaction(settings: Settings) -> str:
    """The first insert of a mention of doc 'ms-a' sleeps, so its transaction holds its new
    entities uncommitted for HOLD_S seconds."""
    dsn = str(settings.database_url).replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE hold_seq")
        conn.execute(
            "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.doc_id = 'ms-a' AND nextval('hold_seq') = 1 THEN PERFORM pg_sleep({HOLD_S});"
            " END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER hold BEFORE INSERT ON mentions FOR EACH ROW EXECUTE FUNCTION hold()"
        )
    return dsn


async def sleeping(dsn: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO mentions%'"
            " AND wait_event = 'PgSleep'"
        )
        row = await cur.fetchone()
        return bool(row and row[0])


async def test_concurrent_title_and_typed_mention_resolve_to_one_entity(
    deps: IndexerDeps, settings: Settings
) -> None:
    dsn = hold_first_transaction(settings)
    first = asyncio.create_task(handle_record(deps, record(FIRST, key=b"ms-a")))
    for _ in range(200):
        if await sleeping(dsn):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the first transaction never reached its held insert")
    second = await handle_record(deps, record(SECOND, key=b"ms-b"))
    assert (await first, second) == ("applied", "applied")

    redmond = await rows(
        deps,
        "SELECT e.name, e.type_group, array_agg(DISTINCT m.doc_id ORDER BY m.doc_id)"
        " FROM entities e JOIN mentions m ON m.entity_id = e.id WHERE e.key = 'redmond'"
        " GROUP BY e.id",
    )
    assert [tuple(r) for r in redmond] == [("Redmond", "PLACE", ["ms-a", "ms-b"])]


# A surface another document still mentions keeps its alias when one document stops naming it.
# The second writer's alias insert found the row there (ON CONFLICT DO NOTHING) before the
# first took the entity's update lock and deleted the row its own mentions no longer supported
# (its snapshot could not see the second writer's uncommitted mention): the concurrent graph
# lacked an alias the serial graph has (test_concurrent_writers, stop 35, 3 of 5 CI runs).
PARIS_V1 = document_event(
    event_id="x1", doc_id="al-x", title="Travel notes", text="Emmanuel Macron lives in Paris."
)
PARIS_V2 = document_event(
    event_id="x2", doc_id="al-x", title="Travel notes", text="Emmanuel Macron lives in Lyon."
)
PARIS_OTHER = document_event(
    event_id="y1",
    doc_id="al-y",
    title="Diary",
    text="Angela Merkel visited Paris with Olaf Scholz.",
)


def hold_evidence_of(settings: Settings, doc_id: str) -> str:
    """The first relationship evidence of ``doc_id`` sleeps on insert: its transaction has
    written its mentions and aliases and holds them uncommitted for HOLD_S seconds."""
    dsn = str(settings.database_url).replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE hold_ev_seq")
        conn.execute(
            "CREATE FUNCTION hold_ev() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.doc_id = '{doc_id}' AND nextval('hold_ev_seq') = 1 THEN"
            f" PERFORM pg_sleep({HOLD_S}); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER hold_ev BEFORE INSERT ON relationship_evidence"
            " FOR EACH ROW EXECUTE FUNCTION hold_ev()"
        )
    return dsn


async def sleeping_on(dsn: str, statement: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND wait_event = 'PgSleep'",
            (statement + "%",),
        )
        row = await cur.fetchone()
        return bool(row and row[0])


async def test_an_alias_another_writer_still_mentions_survives_its_removal(
    deps: IndexerDeps, settings: Settings
) -> None:
    assert await handle_record(deps, record(PARIS_V1, key=b"al-x")) == "applied"
    dsn = hold_evidence_of(settings, "al-y")
    other = asyncio.create_task(handle_record(deps, record(PARIS_OTHER, key=b"al-y")))
    for _ in range(200):
        if await sleeping_on(dsn, "INSERT INTO relationship_evidence"):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the other document's transaction never reached its held insert")
    # The first document stops naming Paris while the other's mention is uncommitted.
    assert await handle_record(deps, record(PARIS_V2, key=b"al-x")) == "applied"
    assert await other == "applied"

    mentioned = await rows(
        deps,
        "SELECT DISTINCT e.key, m.surface FROM mentions m JOIN entities e ON e.id = m.entity_id"
        " ORDER BY 1, 2",
    )
    aliased = await rows(
        deps,
        "SELECT e.key, a.alias FROM aliases a JOIN entities e ON e.id = a.entity_id ORDER BY 1, 2",
    )
    assert ("paris", "Paris") in {tuple(r) for r in mentioned}
    # Aliases are exactly the surfaces that have mentions (graph_store/rebuild.py).
    assert [tuple(r) for r in aliased] == [tuple(r) for r in mentioned]
