"""The indexer's handlers against the real PostgreSQL (and the real broker for dead letters)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from services.core.extraction import SpacyExtractor
from services.indexer.handlers import IndexerDeps, handle_record
from tests.support.records import dlq_messages, record, rows
from tests.support.records import document_event as event

pytestmark = pytest.mark.integration


async def counts(deps: IndexerDeps) -> dict[str, int]:
    out = {}
    for table in ("documents", "chunks", "entities", "relationships", "mentions", "graph_changes"):
        out[table] = (await rows(deps, f"SELECT count(*) FROM {table}"))[0][0]  # noqa: S608 - table names from a constant tuple
    return out


@pytest.fixture(scope="module")
def parse_extractor() -> SpacyExtractor:
    """The opt-in dependency-parse relations (KGSTREAM_SPACY_RELATIONS=parse)."""
    return SpacyExtractor(relations="parse")


async def test_upsert_builds_graph_with_provenance(
    deps: IndexerDeps, parse_extractor: SpacyExtractor
) -> None:
    deps = dataclasses.replace(deps, extractor=parse_extractor)
    assert await handle_record(deps, record(event())) == "applied"
    c = await counts(deps)
    assert c["documents"] == 1
    assert c["chunks"] == 1
    names = {r[0] for r in await rows(deps, "SELECT name FROM entities")}
    assert {"Marie Curie", "Paris", "Pierre Curie", "Albert Einstein"} <= names
    # An SVO relation from the dependency parse (opt-in), with its evidence sentence.
    worked = await rows(
        deps,
        "SELECT s.name, t.name, v.sentence, r.weight FROM relationships r"
        " JOIN entities s ON s.id = r.source_id JOIN entities t ON t.id = r.target_id"
        " JOIN relationship_evidence v ON v.relationship_id = r.id WHERE r.type = 'work_in'",
    )
    assert [(w[0], w[1], w[3]) for w in worked] == [("Marie Curie", "Paris", 1.0)]
    assert "worked in Paris" in worked[0][2]
    # Every node and edge added is in the change log.
    assert c["graph_changes"] == c["entities"] + c["relationships"]


async def test_duplicate_event_is_a_no_op(deps: IndexerDeps) -> None:
    assert await handle_record(deps, record(event())) == "applied"
    before = await counts(deps)
    assert await handle_record(deps, record(event())) == "duplicate"
    assert await counts(deps) == before


async def test_stale_version_is_ignored(deps: IndexerDeps) -> None:
    assert await handle_record(deps, record(event(event_id="v2", version=2))) == "applied"
    older = event(event_id="v1", version=1, text="Marie Curie was born in Warsaw.")
    assert await handle_record(deps, record(older)) == "stale"
    texts = [r[0] for r in await rows(deps, "SELECT text FROM chunks")]
    assert "worked in Paris" in texts[0]


async def test_unchanged_content_without_version(deps: IndexerDeps) -> None:
    assert await handle_record(deps, record(event())) == "applied"
    later = event(event_id="e2", occurred_at="2024-01-02T00:00:00Z")
    assert await handle_record(deps, record(later)) == "unchanged"


async def test_update_diff_keeps_unchanged_chunks(deps: IndexerDeps) -> None:
    long_text = " ".join(
        f"Paragraph {i} mentions Berlin and Paris in sentence {i}." for i in range(60)
    )
    assert await handle_record(deps, record(event(text=long_text, version=1))) == "applied"
    before = dict(await rows(deps, "SELECT content_hash, id FROM chunks"))
    assert len(before) >= 3
    changed = long_text + " A new closing sentence names Madrid."
    assert (
        await handle_record(deps, record(event(event_id="e2", text=changed, version=2)))
        == "applied"
    )
    after = dict(await rows(deps, "SELECT content_hash, id FROM chunks"))
    kept = set(before) & set(after)
    assert kept  # the untouched leading chunks kept their rows (and so their extraction)
    assert all(before[h] == after[h] for h in kept)
    assert set(after) - set(before)  # the tail was re-chunked


async def test_delete_removes_unevidenced_graph_and_blocks_resurrection(deps: IndexerDeps) -> None:
    assert await handle_record(deps, record(event(version=1))) == "applied"
    other = event(
        event_id="o1",
        doc_id="doc-other",
        title="Pierre Curie",
        text="Pierre Curie worked in Paris. Pierre Curie married Marie Curie.",
    )
    assert await handle_record(deps, record(other)) == "applied"
    delete = {
        "event_id": "d1",
        "type": "delete",
        "doc_id": "doc-curie",
        "version": 2,
        "occurred_at": "2024-01-03T00:00:00Z",
    }
    assert await handle_record(deps, record(delete)) == "deleted"
    names = {r[0] for r in await rows(deps, "SELECT name FROM entities")}
    assert "Albert Einstein" not in names  # only the deleted doc mentioned him
    assert {"Pierre Curie", "Paris"} <= names  # still evidenced by the other document
    mention_docs = {r[0] for r in await rows(deps, "SELECT DISTINCT doc_id FROM mentions")}
    assert mention_docs == {"doc-other"}
    weights = await rows(
        deps,
        "SELECT r.weight, (SELECT sum(strength) FROM relationship_evidence v"
        " WHERE v.relationship_id = r.id) FROM relationships r",
    )
    assert all(abs(w - s) < 1e-9 for w, s in weights)
    # A replayed older upsert does not bring the document back.
    assert await handle_record(deps, record(event(version=1))) == "duplicate"
    assert await handle_record(deps, record(event(event_id="e-late", version=1))) == "stale"
    live = await rows(deps, "SELECT count(*) FROM documents WHERE NOT deleted")
    assert live[0][0] == 1


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "invalid_json"),
        (b"\xff\xfe\x00bad", "undecodable"),
        (json.dumps({"event_id": "x", "type": "upsert"}).encode(), "contract_violation"),
    ],
)
async def test_bad_records_are_dead_lettered(
    deps: IndexerDeps, settings: Any, infra: Any, payload: bytes, reason: str
) -> None:
    rec = record(payload, topic="docs-bad")
    assert await handle_record(deps, rec) == "dead_lettered"
    stored = await rows(deps, 'SELECT reason, raw, "offset" FROM dead_letters')
    assert [(r[0], bytes(r[1]), r[2]) for r in stored] == [(reason, payload, rec.offset)]
    messages = [json.loads(m) for m in dlq_messages(infra.bootstrap, settings.dlq_topic)]
    assert [m["reason"] for m in messages] == [reason]
    assert messages[0]["source"]["offset"] == rec.offset


async def test_oversize_document_is_dead_lettered(deps: IndexerDeps) -> None:
    small = deps.__class__(**{**deps.__dict__, "max_document_bytes": 100})
    assert await handle_record(small, record(event())) == "dead_lettered"
    assert (await rows(deps, "SELECT reason FROM dead_letters"))[0][0] == "oversize"
