from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from services.retrieval.answer import extractive_answer
from services.retrieval.grounding import (
    key_places,
    link_probability,
    question_keys,
    seed_weight,
    subsumed,
)
from services.retrieval.ranking import (
    GraphSignal,
    best_paths,
    fuse,
    passage_path_scores,
    personalised_pagerank,
    zscores,
    zscores_array,
)
from services.retrieval.schemas import Context


def test_question_keys_find_names_not_stopwords() -> None:
    keys = question_keys("Who directed the film that was shot in Leland, North Carolina?", [])
    assert "leland" in keys
    assert "north carolina" in keys
    assert "the" not in keys
    assert "who" not in keys


def test_a_name_said_only_inside_a_longer_matched_name_is_not_a_seed() -> None:
    question = "Who directed the film shot in Leland, North Carolina, the home of Leland Stanford?"
    places = key_places(question, ["Leland, North Carolina"])
    assert places["leland north carolina"] == {(6, 9)}  # the span is found among the words
    matched = {"leland north carolina", "north carolina", "leland", "leland stanford", "film"}
    # "north carolina" is only ever inside the longer name; "leland" is inside one name each
    # time ("Leland, North Carolina" and "Leland Stanford"); "film" stands on its own
    assert subsumed(matched, places) == {"north carolina", "leland"}
    # without the longer match, nothing is subsumed
    assert subsumed({"north carolina", "leland"}, places) == set()
    # a span the tokeniser cannot place in the question is never dropped
    assert subsumed({"x y", "x"}, {"x y": set(), "x": {(0, 1)}}) == set()


def test_a_common_word_that_names_a_rare_entity_is_a_light_seed() -> None:
    # "city" is in 2,000 passages and names the film "City" in one; "CKIS-FM" is always its
    # station: the rare film would otherwise be the heaviest seed of the question.
    assert link_probability(mentions=1, occurrences=2000) == pytest.approx(1 / 2000)
    assert link_probability(mentions=2, occurrences=2) == 1.0
    assert link_probability(mentions=9, occurrences=4) == 1.0  # several mentions a passage
    assert link_probability(mentions=3, occurrences=0) == 1.0  # words the text never holds
    station = seed_weight(1.0, 2, 9000, link_probability(2, 2))
    film = seed_weight(1.0, 1, 9000, link_probability(1, 2000))
    assert station > 100 * film > 0
    assert seed_weight(1.0, 2, 9000) == seed_weight(1.0, 2, 9000, 1.0)


def test_ppr_prefers_passages_near_the_seed() -> None:
    edges = [
        (("e", 1), ("c", 10), 1.0),
        (("c", 10), ("e", 2), 1.0),
        (("e", 2), ("c", 20), 1.0),
        (("e", 3), ("c", 30), 1.0),
    ]
    scores = personalised_pagerank(edges, {1: 1.0})
    assert scores[10] > scores[20] > scores.get(30, 0.0)
    assert personalised_pagerank(edges, {99: 1.0}) == {}


def test_ppr_matches_networkx() -> None:
    edges = [(("e", i % 7), ("c", i % 11), 1.0 + i % 3) for i in range(40)]
    edges += [(("e", 1), ("e", 4), 0.5), (("e", 4), ("e", 1), 2.0)]
    g = nx.Graph()
    for a, b, w in edges:
        if not g.has_edge(a, b) or g[a][b]["weight"] < w:
            g.add_edge(a, b, weight=w)
    reference = nx.pagerank(g, alpha=0.85, personalization={("e", 1): 2.0, ("e", 2): 1.0})
    ours = personalised_pagerank(edges, {1: 2.0, 2: 1.0})
    for node, value in reference.items():
        if node[0] == "c":
            assert ours[node[1]] == pytest.approx(value, abs=1e-9)


def test_path_formula_decays_with_hops_and_weak_edges() -> None:
    edges = [(1, 2, 9.0), (2, 3, 9.0), (1, 4, 0.1), (3, 5, 9.0)]
    importance = dict.fromkeys(range(1, 6), 1.0)
    best = best_paths(edges, {1: 2.0}, importance, max_hops=2)
    assert best[1] == pytest.approx(1.0)
    assert best[2] == pytest.approx(0.9 * 0.9)  # strength 9/10, one hop
    assert best[3] == pytest.approx((0.9 * 0.9) ** 2)
    assert best[4] < best[3]  # a weak edge loses to two strong hops
    assert 5 not in best  # three hops away
    scores = passage_path_scores(best, [(2, 100), (3, 100), (4, 200), (9, 300)])
    assert scores[100] == pytest.approx(best[2] + best[3])
    assert set(scores) == {100, 200}


def test_path_formula_rewards_important_entities() -> None:
    best = best_paths([(1, 2, 1.0), (1, 3, 1.0)], {1: 1.0}, {1: 1.0, 2: 1.0, 3: 0.1})
    assert best[2] > best[3]


def test_zscores_and_fusion() -> None:
    assert zscores({1: 2.0, 2: 2.0}) == {1: 0.0, 2: 0.0}
    z = zscores({1: 1.0, 2: 3.0})
    assert z[1] == pytest.approx(-1.0)
    assert z[2] == pytest.approx(1.0)
    dense = {1: 0.9, 2: 0.5, 3: 0.1}
    graph = GraphSignal.of({2: 0.5, 3: 0.01}).over(dense)
    fused = fuse({"vector": dense, "graph": graph}, {"vector": 0.5, "graph": 0.5}, dense)
    assert max(fused, key=fused.__getitem__) == 2  # graph support lifts the bridge passage
    lexical_only = fuse({"lexical": {3: 5.0, 2: 1.0}}, {"lexical": 1.0, "vector": 0.0}, [1, 2, 3])
    assert max(lexical_only, key=lexical_only.__getitem__) == 3
    assert lexical_only[1] == lexical_only[2]  # unscored: the signal's floor


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


def test_array_zscores_follow_the_mapping_rule() -> None:
    values = {1: 0.5, 2: 3.0, 3: -1.25, 4: 0.5}
    expected = zscores(values)
    got = zscores_array(np.array(list(values.values())))
    assert np.allclose(got, [expected[k] for k in values], rtol=0, atol=1e-12)
    assert not zscores_array(np.full(3, 2.0)).any()  # flat: all zeros, as zscores
    assert len(zscores_array(np.zeros(0))) == 0
    # a NaN (the cosine of a zero vector) makes the signal flat, as zscores does: no NaN fuses
    assert not zscores_array(np.array([0.2, np.nan, 0.4])).any()
    assert zscores({1: 0.2, 2: float("nan")}) == {1: 0.0, 2: 0.0}
    fused = fuse(
        {"vector": {1: 0.3, 2: float("nan")}, "graph": {1: 1.0, 2: 2.0}},
        {"vector": 1, "graph": 1},
        [1, 2],
    )
    assert fused[2] > fused[1]


def test_graph_signal_orders_once_and_reads_log_scores_over_the_median() -> None:
    scores = {7: 0.2, 3: 0.2, 9: 0.0, 4: 1.5, 5: 0.001, 6: 0.001}
    signal = GraphSignal.of(scores)
    assert signal.order == (4, 3, 7, 5, 6, 9)  # best first, ties by id
    # the median positive score of the candidates fused (0.2 of 0.2, 0.2, 1.5), not of the
    # whole walk (whose weak tail grows with the corpus)
    assert signal.over([3, 4, 7, 9, 11]) == {
        3: math.log1p(1.0),
        4: math.log1p(1.5 / 0.2),
        7: math.log1p(1.0),
        9: 0.0,
        11: 0.0,
    }
    # more weakly supported candidates lower the scale: the same passage reads higher
    assert signal.over([3, 5, 6])[3] > signal.over([3, 4, 7])[3]
    assert signal.over([9]) == {9: 0.0}
