"""The incremental-cost bench's pure helpers (bench/incremental_cost.py) and its stale-report
check on a small graph (bench/_stale_reports.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.communities.fingerprint import Fingerprinter
from services.communities.graph import GraphRows, build_graph
from services.communities.structure import PreviousSnapshot
from services.core.contracts import event_problems
from tests.support.openai_stub import count_tokens, extract_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the benches run
from _stale_reports import stale_flags
from incremental_cost import (
    Row,
    chat_kind,
    choose,
    delete_event,
    edit_text,
    edited_event,
    phase_rows,
    render,
    report_answer,
    reviewer,
    summary_levels,
    tally,
)

EVENT = {
    "event_id": "d1@1",
    "type": "upsert",
    "doc_id": "d1",
    "title": "Irwin Shaw",
    "text": "Irwin Shaw was a writer. He lived in Paris. Marlon Brando starred in his film.",
    "occurred_at": "2024-01-01T00:00:00Z",
}


def test_choose_is_seeded_distinct_and_excludes() -> None:
    ids = [f"d{i}" for i in range(50)]
    first = choose(ids, 5, seed=3)
    assert first == choose(list(reversed(ids)), 5, seed=3)
    assert len(set(first)) == 5
    other = choose(ids, 10, seed=3, exclude=first)
    assert not set(other) & set(first)
    with pytest.raises(ValueError, match="available"):
        choose(ids, 46, seed=1, exclude=first)


def test_edit_drops_the_last_sentence_and_links_a_new_name() -> None:
    edited = edit_text(EVENT["text"], "d1")
    assert edited == edit_text(EVENT["text"], "d1")
    assert "Marlon Brando" not in edited
    assert edited.startswith("Irwin Shaw was a writer. He lived in Paris. ")
    assert edited.endswith(f"Irwin Shaw was reviewed by {reviewer('d1')}.")
    assert reviewer("d1") != reviewer("d2")
    graph = extract_graph(edited)  # the stub extracts the new name and links it
    names = {e["name"] for e in graph["entities"]}
    assert reviewer("d1") in names
    assert {"source": "Irwin Shaw", "target": reviewer("d1")}.items() <= next(
        r for r in graph["relationships"] if r["target"] == reviewer("d1")
    ).items()
    assert edit_text("One sentence only.", "d1").startswith("One sentence only. One")


def test_changed_and_deleted_events_are_valid_new_versions() -> None:
    new = edited_event(EVENT, 2)
    gone = delete_event(EVENT, 2)
    assert (new["event_id"], new["version"], new["doc_id"]) == ("d1@2", 2, "d1")
    assert new["text"] == edit_text(EVENT["text"], "d1")
    assert (gone["type"], gone["doc_id"]) == ("delete", "d1")
    assert event_problems(new, 1 << 20) == [] == event_problems(gone, 1 << 20)


def _chat(system: str, *users: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": system},
            *({"role": "user", "content": u} for u in users),
        ]
    }


def test_tally_counts_calls_inputs_and_prompt_tokens_by_kind() -> None:
    extract = _chat("You build a knowledge graph from the text.", "Marie Curie worked.")
    glean = _chat("You build a knowledge graph from the text.", "text", "more?")
    report = _chat("You write a report about one community of it", "Community 4 (level 0)")
    judge = _chat("You decide whether two names refer", "A: x\nB: y")
    log = [
        ("/v1/chat/completions", extract),
        ("/v1/chat/completions", glean),
        ("/v1/chat/completions", report),
        ("/v1/chat/completions", judge),
        ("/v1/embeddings", {"input": ["a b", "c"]}),
        ("/v1/embeddings", {"input": "one"}),
    ]
    assert [chat_kind(b) for _, b in log[:4]] == [
        "extraction",
        "gleaning",
        "summary",
        "adjudication",
    ]
    counts = tally(log)
    assert counts.calls == {
        "extraction": 1,
        "gleaning": 1,
        "summary": 1,
        "adjudication": 1,
        "embedding": 2,
    }
    assert counts.inputs["embedding"] == 3
    assert counts.prompt_tokens["embedding"] == 4
    # as the stub counts the usage it answers with: each message's tokens + 4
    assert counts.prompt_tokens["extraction"] == (9 + 4) + (4 + 4)
    assert counts.prompt_tokens["extraction"] == sum(
        count_tokens(m["content"]) + 4 for m in extract["messages"]
    )
    assert counts.llm_calls() == 4
    deeper = _chat("You write a report about one community", "Community 9 (level 2, 40 entities)")
    assert summary_levels([extract, report, deeper, deeper]) == {
        -1: [1, counts.prompt_tokens["summary"]],  # no "(level N," in its first line
        2: [2, 2 * sum(count_tokens(m["content"]) + 4 for m in deeper["messages"])],
    }


def test_report_answer_fits_the_writers_schema() -> None:
    prompt = "\n".join(
        [
            "Community 7 (level 1, 3 entities)",
            "Entities (name | type | description):",
            "- Paris | X | y",
        ]
    )
    out = json.loads(report_answer(_chat("You write a report", prompt)))
    assert out["title"] == "About Paris"
    assert out["summary"] == "Community 7 (level 1, 3 entities)"
    assert set(out) == {"title", "summary", "findings", "rating"}


def test_fraction_rows_check_their_targets() -> None:
    rows = phase_rows(
        {"llm_calls": 1000, "wall_s": 100.0, "summary_calls": 0},
        {"llm_calls": 30, "wall_s": 4.0},
        {"llm_calls": 0.02, "wall_s": 0.05},
    )
    assert rows[0] == Row("llm_calls", 1000, 30, 0.02)
    assert (rows[0].fraction, rows[0].met) == (0.03, False)
    assert (rows[1].fraction, rows[1].met) == (0.04, True)
    assert (rows[2].fraction, rows[2].met) == (None, None)  # nothing to divide by
    table = render("(a)", rows)
    assert "3.00%  <= 2% MISSED" in table
    assert "4.00%  <= 5% met" in table


def _rows(entities: list[int], rels: list[tuple[int, int, int]]) -> GraphRows:
    """Content digests derived from the ids: a row keeps its digest from graph to graph."""

    def digests(ids: list[int]) -> np.ndarray:
        return np.array([i.to_bytes(16, "little") for i in ids], dtype="V16")

    return GraphRows(
        entity_ids=np.array(entities, dtype=np.int64),
        entity_digests=digests(entities),
        rel_ids=np.array([r[0] for r in rels], dtype=np.int64),
        rel_src=np.array([r[1] for r in rels], dtype=np.int64),
        rel_dst=np.array([r[2] for r in rels], dtype=np.int64),
        rel_weight=np.ones(len(rels)),
        rel_digests=digests([r[0] for r in rels]),
    )


def test_stale_flags_mark_communities_whose_members_or_edges_changed() -> None:
    # Level 0: {1, 2} (id 10), {3, 4} (id 11), {5} (id 12); level 1: everything (id 20).
    before = build_graph(_rows([1, 2, 3, 4, 5], [(100, 1, 2), (101, 3, 4), (102, 2, 3)]))
    printer = Fingerprinter(before)
    level0 = printer.level(np.array([0, 0, 1, 1, 2]), 3)
    level1 = printer.level(np.zeros(5, dtype=np.int64), 1)
    previous = PreviousSnapshot(
        member_community=np.array([10, 10, 11, 11, 12, 20, 20, 20, 20, 20]),
        member_entity=np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 5]),
        community_ids=np.array([10, 11, 12, 20]),
        community_levels=np.array([0, 0, 0, 1]),
        community_sizes=np.array([2, 2, 1, 5]),
        community_parents=np.array([20, 20, 20, -1]),
        community_fingerprints=[*level0, *level1],
    )
    assert stale_flags(before, previous) == [False, False, False, False]
    # An edge inside {3, 4} is gone and entity 5 is deleted; {1, 2} is untouched. Level 1
    # holds all of it, so it is stale too. An edge to a new entity 6 is outside every old one.
    after = build_graph(_rows([1, 2, 3, 4, 6], [(100, 1, 2), (102, 2, 3), (103, 1, 6)]))
    assert stale_flags(after, previous) == [False, True, True, True]
