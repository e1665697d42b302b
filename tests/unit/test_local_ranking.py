from __future__ import annotations

import networkx as nx
import pytest

from services.query_api.local import fuse, personalised_pagerank, question_keys, zscores
from services.query_api.schemas import Context
from services.query_api.service import extractive_answer


def test_question_keys_find_names_not_stopwords() -> None:
    keys = question_keys("Who directed the film that was shot in Leland, North Carolina?", [])
    assert "leland" in keys
    assert "north carolina" in keys
    assert "the" not in keys
    assert "who" not in keys


def test_ppr_prefers_passages_near_the_seed() -> None:
    g = nx.Graph()
    g.add_edge(("e", 1), ("c", 10))
    g.add_edge(("c", 10), ("e", 2))
    g.add_edge(("e", 2), ("c", 20))
    g.add_edge(("e", 3), ("c", 30))
    scores = personalised_pagerank(g, {1: 1.0})
    assert scores[10] > scores[20] > scores.get(30, 0.0)


def test_zscores_and_fusion() -> None:
    assert zscores({1: 2.0, 2: 2.0}) == {1: 0.0, 2: 0.0}
    z = zscores({1: 1.0, 2: 3.0})
    assert z[1] == pytest.approx(-1.0)
    assert z[2] == pytest.approx(1.0)
    fused = fuse({1: 0.9, 2: 0.5, 3: 0.1}, {2: 0.5, 3: 0.01}, 0.5)
    assert max(fused, key=fused.__getitem__) == 2  # graph support lifts the bridge passage


def test_extractive_answer_quotes_a_source_sentence() -> None:
    ctx = Context(
        doc_id="d1",
        chunk_id=1,
        title="Leland",
        text="Leland is a town. Maximum Overdrive was shot in Leland.",
        score=1.0,
    )
    answer = extractive_answer("Which film was shot in Leland?", [ctx])
    assert answer == "Maximum Overdrive was shot in Leland. [d1]"
    assert extractive_answer("anything", []).startswith("No indexed passage")
