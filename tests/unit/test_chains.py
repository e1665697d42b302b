"""Chains of passages through bridge entities (services/retrieval/chains.py)."""

from __future__ import annotations

import pytest

from services.retrieval import chains
from services.retrieval.grounding import seed_weight

# "What castle is in the birthplace of the performer of Falling Out?"
# Passage 1 (the head) names the song and its performer (entity 10); passage 2, the
# performer's biography (about entity 10), names the city (entity 20) but no question term the
# head lacks; passage 3 names the castle in that city. Passage 4 mentions the performer, is not
# about them and says nothing of the question the head did not. Entity 99 is the question's
# own name (a seed); passage 5 is reached only through it.
PAIRS = [(10, 1), (10, 2), (10, 4), (20, 2), (20, 3), (99, 1), (99, 5)]
TERMS = {
    1: frozenset({"fall", "perform"}),
    2: frozenset({"perform"}),
    3: frozenset({"castl"}),
    4: frozenset({"fall"}),
    5: frozenset({"fall", "perform", "castl"}),
}
BASE = {1: 2.0, 2: 1.0, 3: 0.2, 4: 3.0, 5: 0.1, 6: -1.0, 7: -1.2, 8: -1.5}
IDF = {"fall": 2.0, "perform": 1.0, "castl": 3.0}


def links() -> chains.Links:
    out = chains.Links()
    out.add(PAIRS)
    out.add_about([(2, 10)])
    return out


def run(
    base: dict[int, float], *, seeds: list[int], lexical_weight: float = 1.0
) -> list[chains.Chain]:
    graph = links()
    relevance = chains.Relevance(base, IDF, lexical_weight, TERMS)
    beam = chains.starts([1], base, seeds, TERMS)
    done: list[chains.Chain] = []
    for _ in range(5):
        beam, ended = chains.step(beam, graph, relevance, width=3, total=100)
        done += ended
        if not beam:
            break
    return done + beam


def test_a_chain_reaches_the_third_hop_through_the_bridge_entities_article() -> None:
    # 1 -> 2: passage 2 adds no question term but is about the bridge entity (10);
    # 2 -> 3: passage 3 adds "castl". Passage 4 (relevance 3.0) adds nothing: never taken.
    result = run(BASE, seeds=[99])
    assert [ch.passages for ch in result] == [(1, 2, 3)]
    assert result[0].covered == frozenset({"fall", "perform", "castl"})


def test_a_step_needs_relevance_above_the_mean() -> None:
    # Without the uncovered term's lexical lift passage 3 stays below the candidates' mean.
    assert [ch.passages for ch in run({**BASE, 3: -0.3}, seeds=[99], lexical_weight=0)] == [(1, 2)]
    assert [ch.passages for ch in run({**BASE, 2: -2.0}, seeds=[99])] == [(1,)]


def test_the_questions_own_names_are_not_bridges() -> None:
    # Entity 10 named by the question: nothing leads to passage 2, so the chain stays at 1.
    assert [ch.passages for ch in run(BASE, seeds=[10, 99])] == [(1,)]


def test_relevance_counts_only_the_terms_the_chain_has_not_covered() -> None:
    relevance = chains.Relevance({1: 0.0, 3: 0.0, 5: 0.0}, IDF, 1.0, TERMS)
    fresh = relevance.of(chains.Chain((1,), 0.0, frozenset(), frozenset()))
    covered = relevance.of(chains.Chain((1,), 0.0, frozenset(), frozenset({"fall", "perform"})))
    # uncovered idf sums: fresh 3 / 3 / 6, after the head 0 / 3 / 3
    assert fresh[5] > fresh[1] == pytest.approx(fresh[3])
    assert covered[3] == pytest.approx(covered[5])
    assert covered[3] > covered[1]


def test_an_entity_already_used_is_not_followed_back() -> None:
    chain = chains.Chain((1, 2), 2.5, frozenset({99, 10}), TERMS[1] | TERMS[2])
    assert chains.frontier(chain, links()) == {20}
    assert chains.reachable([chain], links()) == {3}


def test_rarer_bridges_score_higher() -> None:
    assert seed_weight(1.0, 2, 1000) > seed_weight(1.0, 30, 1000) > 0


def test_the_ranking_goes_hop_by_hop_and_keeps_every_head() -> None:
    a = chains.Chain((1, 2, 3), 3.5, frozenset())
    b = chains.Chain((6, 7), 4.0, frozenset())
    # heads first in their own order (8's chain was dropped by the beam), then second hops
    # best chain first, then third hops
    assert chains.ranking([1, 6, 8], [a, b]) == [1, 6, 8, 7, 2, 3]


def test_interleave_gives_equal_slots_and_keeps_each_item_once() -> None:
    assert chains.interleave([1, 2, 3, 4], [1, 2, 9, 8]) == [1, 2, 3, 9, 4, 8]
    assert chains.interleave([], [5]) == [5]
