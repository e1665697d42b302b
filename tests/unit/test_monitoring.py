"""Retrieval monitoring's pure parts (services/retrieval/monitoring.py): path patterns, query
ids, the A/B swap, bounded labels, the hour's window and the feedback ledger."""

from __future__ import annotations

import pytest

from services.retrieval.contexts import Retrieval
from services.retrieval.monitoring import (
    PATTERN_LABELS,
    FeedbackLedger,
    PathWindow,
    PatternLabels,
    ab_swap,
    parse_query_id,
    path_pattern,
    query_id,
    relation_label,
)
from services.retrieval.schemas import CommunityHit, Route


def _route(*relations: str) -> Route:
    hops = [(f"e{i}", r, f"e{i + 1}", "evidence") for i, r in enumerate(relations)]
    return Route(entities=[f"e{i}" for i in range(len(relations) + 1)], hops=hops, score=1.0)


def test_patterns_name_mode_hops_and_relation_types() -> None:
    assert path_pattern(Retrieval("vector", [])) == "vector"
    assert path_pattern(Retrieval("local", [])) == "local:1hop"  # no chain grew
    assert path_pattern(Retrieval("local", [], chain=(4, 9, 2))) == "local:3hop"
    hit = CommunityHit(id=1, level=2, title="t", summary="s", score=0.5)
    assert path_pattern(Retrieval("global", [], communities=[hit])) == "global:L2"
    assert path_pattern(Retrieval("global", [])) == "global:none"
    two = Retrieval("path", [], routes=[_route("DIRECTED", "born in"), _route("x")])
    assert path_pattern(two) == "path:2hop:directed>born_in"  # the best route only
    long = Retrieval("path", [], routes=[_route("a", "b", "c", "d", "e")])
    assert path_pattern(long) == "path:5hop:a>b>c>d>..."
    assert path_pattern(Retrieval("path", [])) == "path:none"


def test_relation_labels_are_bounded_text() -> None:
    assert relation_label("Works For") == "works_for"
    assert relation_label("'; DROP TABLE--") == "drop_table"
    assert relation_label("!!!") == "related"
    assert len(relation_label("x" * 100)) == 24


def test_the_other_arm_is_vector_for_graph_modes_and_local_for_vector() -> None:
    assert ab_swap("vector") == "local"
    assert {ab_swap(m) for m in ("local", "global", "path")} == {"vector"}


def test_query_ids_carry_arm_and_mode_and_are_unique() -> None:
    made = query_id("local", "swapped")
    assert parse_query_id(made) == ("swapped", "local")
    assert made != query_id("local", "swapped")
    for bad in ("", "swapped.local", "swapped.local.xyz", "x.local." + "0" * 32,
                "routed.auto." + "0" * 32, "routed.local." + "0" * 32 + ".1"):  # fmt: skip
        with pytest.raises(ValueError, match="query id"):
            parse_query_id(bad)


def test_pattern_labels_stop_growing_at_the_limit() -> None:
    labels = PatternLabels()
    named = [labels.label(f"path:1hop:t{i}") for i in range(PATTERN_LABELS + 10)]
    assert named[:PATTERN_LABELS] == [f"path:1hop:t{i}" for i in range(PATTERN_LABELS)]
    assert set(named[PATTERN_LABELS:]) == {"other"}
    assert labels.label("path:1hop:t3") == "path:1hop:t3"  # a known one keeps its name


def test_window_share_of_the_most_common_pattern_over_the_last_hour() -> None:
    window = PathWindow(span_s=3600)
    assert window.top_share(now=0) == 0.0
    for i in range(9):
        window.add("local:2hop", now=float(i))
    window.add("vector", now=10.0)
    assert window.top_share(now=10.0) == pytest.approx(0.9)
    window.add("vector", now=3605.0)  # the local ones (0-8 s) are older than the hour by now
    assert window.top_share(now=3608.5) == pytest.approx(1.0)  # two vector queries left
    assert window.top_share(now=7300.0) == 0.0


def test_feedback_ledger_counts_an_id_once_and_forgets_the_oldest() -> None:
    ledger = FeedbackLedger(limit=2)
    assert ledger.first("a")
    assert not ledger.first("a")
    assert ledger.first("b")
    assert ledger.first("c")
    assert ledger.first("a")  # forgotten after two newer ids
