"""The synthetic scale corpus (bench/synth_corpus.py): one seed gives one corpus, another seed
another; its statistics fall in the ranges the scale benchmark relies on; every event is a
valid document event; questions name entities that share their gold documents; and the memory
summary bench/bench_scale.py reports."""

from __future__ import annotations

import sys
from pathlib import Path

from services.core.contracts import encode_event, event_problems

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the benches run
from _scale_harness import MemorySampler
from synth_corpus import Corpus, questions


def test_a_seed_gives_one_corpus_and_another_seed_another() -> None:
    first = list(Corpus(200, seed=3).events())
    assert first == list(Corpus(200, seed=3).events())
    other = list(Corpus(200, seed=4).events())
    assert [e["text"] for e in first] != [e["text"] for e in other]


def test_statistics_are_heavy_tailed_shared_and_varied() -> None:
    corpus = Corpus(2000, seed=7)
    events = list(corpus.events())
    stats = corpus.stats.to_json()
    assert stats["documents"] == 2000
    assert 3 <= stats["sentences_per_document"]["median"] <= 7  # log-normal, median ~5
    assert stats["sentences_per_document"]["max"] >= 20  # a tail of long documents
    tail = stats["documents_per_entity"]
    assert tail["top"][0] >= 20 * tail["p50"]  # hubs far above the median entity
    assert tail["in_one_document"] < stats["distinct_entity_names"]  # names are shared
    assert 1.5 <= stats["distinct_entity_names"] / stats["documents"] <= 6
    assert 5 <= stats["entity_names_per_document"] <= 15
    assert len({e["text"] for e in events}) == len(events)  # no copies


def test_every_event_is_a_valid_document_event() -> None:
    for event in Corpus(300, seed=11).events():
        assert event_problems(event, max_bytes=1_000_000) == [], event["doc_id"]
        assert event["title"] in event["text"]
        assert len(encode_event(event)) > 0


def test_questions_name_two_entities_of_their_gold_documents() -> None:
    events = list(Corpus(300, seed=5).events())
    names = {e["doc_id"]: set(e["metadata"]["names"]) for e in events}
    asked = questions(events, 40, seed=5)
    assert len(asked) == 40
    for q in asked:
        assert q["gold_doc_ids"]
        named = {n for n in names[q["gold_doc_ids"][0]] if n in q["question"]}
        assert len(named) >= 2
        assert all(named <= names[doc] for doc in q["gold_doc_ids"])


def test_memory_summary_reads_the_quarter_mark_and_the_peak() -> None:
    sampler = MemorySampler(indexer=0, postmaster=None, broker=None)
    sampler.samples = [(float(t), 100.0 + t, 50.0, 10.0) for t in range(8)] + [(8.0, 90.0, 5, 1)]
    summary = sampler.summary()["indexer_rss_mib"]
    assert summary == {
        "start": 100.0,
        "at_25pct": 102.0,
        "end": 90.0,
        "peak": 107.0,
        "end_vs_25pct": round(90 / 102, 3),
        "samples": 9,
    }
