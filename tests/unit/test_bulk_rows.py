"""The bulk builder's rows (bench/bulk_rows.py) on a tiny synthetic corpus: counts agree
across tables, every mention's offsets point at its name in its chunk, the aggregates are the
indexer's rules over the rows, one seed gives the same rows, and bad input fails clearly."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.core.chunking import Chunker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the benches run
from bulk_rows import DocumentRows, GraphRows, HashedEmbedder
from synth_corpus import Corpus

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _build(documents: int = 40, seed: int = 5) -> tuple[list[DocumentRows], GraphRows]:
    corpus = Corpus(documents, seed)
    # Small chunks, so that long documents have several (overlapping) chunks.
    rows = GraphRows(
        {e.name: e.kind for e in corpus.entities}, HashedEmbedder(16, seed), Chunker(40, 8), NOW
    )
    return [rows.add(e) for e in corpus.events()], rows


def _all(docs: list[DocumentRows], name: str) -> list[tuple[Any, ...]]:
    return [row for d in docs for row in getattr(d, name)]


def test_every_mention_points_at_its_name_and_titles_mention_every_chunk() -> None:
    docs, _ = _build()
    chunks = {c[0]: c for c in _all(docs, "chunks")}
    assert max(Counter(c[1] for c in chunks.values()).values()) > 1  # multi-chunk documents
    placed = [m for m in _all(docs, "mentions") if m[6] >= 0]
    assert placed
    for _, _, chunk_id, doc_id, surface, _, start, end, sentence in placed:
        text = chunks[chunk_id][4]
        assert text[start:end] == surface
        assert chunks[chunk_id][1] == doc_id
        assert surface in sentence
        assert sentence in text
    titles = Counter(m[2] for m in _all(docs, "mentions") if m[6] < 0)
    assert set(titles) == set(chunks)
    assert set(titles.values()) == {1}


def test_counts_agree_across_tables() -> None:
    docs, rows = _build()
    mentions, evidence = _all(docs, "mentions"), _all(docs, "evidence")
    entities, relationships = list(rows.entities()), list(rows.relationships())
    assert len(docs) == len({d.document[0] for d in docs}) == 40
    assert [e[0] for e in entities] == list(range(1, len(entities) + 1))
    assert Counter(m[1] for m in mentions) == {e[0]: e[5] for e in entities}
    per_rel = Counter(v[1] for v in evidence)
    for rid, source, target, kind, weight, count, description in relationships:
        assert per_rel[rid] == count
        assert weight == pytest.approx(0.3 * count)
        assert source < target
        assert kind == "co_occurs"
        assert description
    aliases = _all(docs, "aliases")
    assert len(aliases) == len({(a[0], a[1]) for a in aliases})
    assert {a[0] for a in aliases} == {e[0] for e in entities}
    changes = Counter((c[1], c[3]) for c in _all(docs, "changes"))
    assert changes[("node", "add")] == len(entities)
    assert changes[("edge", "add")] == len(relationships)
    assert rows.counts["mentions"] == len(mentions)


def test_entity_aggregates_follow_the_indexer_rules() -> None:
    docs, rows = _build()
    by_entity: dict[int, list[tuple[Any, ...]]] = {}
    for m in _all(docs, "mentions"):
        by_entity.setdefault(m[1], []).append(m)
    for eid, key, name, kind, description, _count, vector, *_, group, tenant in rows.entities():
        assert tenant is None  # the synthetic corpus is untenanted
        mine = by_entity[eid]
        types = Counter(m[5] for m in mine)
        assert kind == min(types, key=lambda t: (-types[t], t))
        # the title mention of every chunk (TOPIC) can outnumber the named ones, as in the indexer
        assert kind in {"PERSON", "GPE", "ORG", "TOPIC"}
        assert group in {"PERSON", "PLACE", "ORG"}
        assert name in {m[4] for m in mine}
        assert len(key) > 0
        first = sorted({(m[3], m[8]) for m in mine})[:5]
        assert description == " ".join(s for _, s in first)[:1500]
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_a_seed_gives_the_same_rows() -> None:
    first, _ = _build(12, seed=3)
    again, _ = _build(12, seed=3)
    assert [d.mentions for d in first] == [d.mentions for d in again]
    assert [[c[:8] for c in d.chunks] for d in first] == [[c[:8] for c in d.chunks] for d in again]


def test_hashed_embeddings_are_seeded_unit_vectors() -> None:
    a, b = HashedEmbedder(32, 1), HashedEmbedder(32, 2)
    assert np.array_equal(a.vector("Port Marton"), HashedEmbedder(32, 1).vector("Port Marton"))
    assert not np.array_equal(a.vector("Port Marton"), b.vector("Port Marton"))
    near = float(a.vector("Lake Marton trade") @ a.vector("Lake Marton"))
    far = float(a.vector("Lake Marton trade") @ a.vector("James Smith"))
    assert near > far
    assert len(a.embed(["x", ""])[1]) == 32
    with pytest.raises(ValueError, match="dimension"):
        HashedEmbedder(0, 1)


def test_an_event_without_generated_names_is_refused() -> None:
    _, rows = _build(1)
    event = {"event_id": "x@1", "type": "upsert", "doc_id": "x", "title": "", "text": "Hello.",
             "metadata": {}, "occurred_at": "2024-01-01T00:00:00Z"}  # fmt: skip
    with pytest.raises(ValueError, match=r"metadata\.names"):
        rows.add(event)
