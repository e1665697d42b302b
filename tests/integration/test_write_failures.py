"""Write failures are classified by what the error is (issue 30, finding 1): a statement the
database can never accept dead-letters its event with the reason and the partition goes on; a
failure the database keeps answering for one event is retried a bounded number of times; a
document shared with many groups is stored and visible. On 79715af each of these retried its
event forever (``asyncio.wait_for`` turns that hang into a failure here)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from services.core.access import Caller
from services.indexer.handlers import IndexerDeps, handle_batch
from services.retrieval.visibility import DOC_VISIBLE, params, widened
from tests.support.faults import add_fault_trigger
from tests.support.records import document_event, record, rows

pytestmark = pytest.mark.integration

HANG_GUARD_S = 120  # not a timing bound: the old code never returned at all


def doc(n: int, **extra: Any) -> dict[str, Any]:
    return document_event(
        event_id=f"e-{n}",
        doc_id=f"doc-{n}",
        title=f"Report {n}",
        text=f"Ada Lovelace wrote report {n} in London with Charles Babbage.",
        **extra,
    )


async def settle(deps: IndexerDeps, events: list[dict[str, Any]]) -> list[str]:
    batch = [record(e) for e in events]
    return list(await asyncio.wait_for(handle_batch(deps, batch), HANG_GUARD_S))


async def letters(deps: IndexerDeps) -> list[tuple[str, str, str]]:
    found = await rows(deps, "SELECT doc_id, reason, detail FROM dead_letters ORDER BY id")
    return [(r.doc_id, r.reason, r.detail) for r in found]


async def test_a_document_shared_with_many_groups_is_stored_and_visible(
    deps: IndexerDeps,
) -> None:
    """The probe's document: 200 groups (the old (tenant, acl) index row overflowed at ~150).
    Names as random as real group ids (base64 digests): repetitive ones compress into the
    old index row and hid the limit."""
    groups = [base64.b64encode(hashlib.sha256(b"%d" % i).digest()).decode() for i in range(200)]
    outcomes = await settle(deps, [doc(1, acl=groups), doc(2)])
    assert outcomes == ["applied", "applied"]
    assert await letters(deps) == []
    member = Caller(groups=frozenset({groups[137]}))
    outsider = Caller(groups=frozenset({"nobody"}))
    async with deps.engine.connect() as conn:
        sql = text(f"SELECT doc_id FROM documents d WHERE {DOC_VISIBLE} ORDER BY doc_id")  # noqa: S608
        seen = [r.doc_id for r in await conn.execute(sql, params(member))]
        hidden = [r.doc_id for r in await conn.execute(sql, params(outsider))]
        # The whole-corpus check walks the ACL by its digest: a member of one of the 200
        # groups sees every live document, an outsider does not.
        assert (await widened(conn, member)).whole_corpus
        assert not (await widened(conn, outsider)).whole_corpus
    assert seen == ["doc-1", "doc-2"]
    assert hidden == ["doc-2"]


async def test_a_statement_over_a_database_limit_is_dead_lettered(
    deps: IndexerDeps, database_url: str
) -> None:
    """SQLSTATE 54000 (program limit exceeded) is permanent whatever the driver's exception
    class (psycopg files it under OperationalError, with lost connections)."""
    add_fault_trigger(
        database_url,
        "over_limit",
        "BEFORE INSERT ON chunks",
        "IF NEW.doc_id = 'doc-2' THEN RAISE EXCEPTION 'index row size 3240 exceeds btree"
        " version 4 maximum 2704' USING ERRCODE = '54000'; END IF; RETURN NEW;",
    )
    outcomes = await settle(deps, [doc(1), doc(2), doc(3)])
    assert outcomes == ["applied", "dead_lettered", "applied"]
    [(doc_id, reason, detail)] = await letters(deps)
    assert (doc_id, reason) == ("doc-2", "processing_failed")
    assert detail.startswith("ProgramLimitExceeded: index row size 3240")


async def test_an_event_the_database_keeps_refusing_is_dead_lettered_after_bounded_retries(
    deps: IndexerDeps, database_url: str
) -> None:
    """A transient SQLSTATE answered for one event again and again (the server is up and
    applies its neighbours) is that event's own failure: dead-lettered as retries_exhausted
    after ``max_refusals`` answers, so its partition goes on."""
    add_fault_trigger(
        database_url,
        "refuse",
        "BEFORE INSERT ON chunks",
        "IF NEW.doc_id = 'doc-2' THEN PERFORM nextval('refuse_seq');"
        " RAISE EXCEPTION 'out of memory' USING ERRCODE = '53200'; END IF; RETURN NEW;",
    )
    bounded = replace(deps, max_refusals=3)
    outcomes = await settle(bounded, [doc(1), doc(2), doc(3)])
    assert outcomes == ["applied", "dead_lettered", "applied"]
    [(doc_id, reason, detail)] = await letters(deps)
    assert (doc_id, reason) == ("doc-2", "retries_exhausted")
    assert "refused it 3 times" in detail
    assert "OutOfMemory: out of memory" in detail
    [(attempts,)] = await rows(deps, "SELECT last_value FROM refuse_seq")
    assert attempts == 3


async def test_a_transient_failure_that_clears_is_still_retried_until_it_lands(
    deps: IndexerDeps, database_url: str
) -> None:
    """The bound counts refusals of one event; fewer than the bound never dead-letter."""
    add_fault_trigger(
        database_url,
        "flaky",
        "BEFORE INSERT ON chunks",
        "IF NEW.doc_id = 'doc-2' AND nextval('flaky_seq') <= 2 THEN"
        " RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01'; END IF; RETURN NEW;",
    )
    outcomes = await settle(replace(deps, max_refusals=3), [doc(1), doc(2)])
    assert outcomes == ["applied", "applied"]
    assert await letters(deps) == []
