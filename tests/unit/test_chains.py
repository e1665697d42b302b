"""Chains of passages through bridge entities (services/query_api/chains.py)."""

from __future__ import annotations

from services.query_api import chains

# "What castle is in the birthplace of the performer of Falling Out?"
# passage 1 (the head) names the song and its performer (entity 10); passage 2, the performer's
# biography, names the city (entity 20); passage 3 names the castle in that city. Passage 4
# also mentions the performer but says nothing the question asks that passage 1 did not.
PAIRS = [(10, 1), (10, 2), (10, 4), (20, 2), (20, 3), (99, 1), (99, 5)]
TERMS = {
    1: frozenset({"fall", "perform"}),
    2: frozenset({"perform", "born"}),
    3: frozenset({"castl"}),
    4: frozenset({"fall"}),
    5: frozenset({"fall", "perform"}),
}
RELEVANCE = {1: 2.0, 2: 0.5, 3: 1.0, 4: 3.0, 5: 0.1}


def run(relevance: dict[int, float], seeds: list[int]) -> list[chains.Chain]:
    links = chains.Links.of(PAIRS)
    beam = chains.starts([1], relevance, seeds, TERMS)
    done: list[chains.Chain] = []
    for _ in range(5):
        beam, ended = chains.step(beam, links, relevance, TERMS, width=3)
        done += ended
        if not beam:
            break
    return done + beam


def test_a_chain_follows_bridge_entities_while_each_step_adds_a_question_term() -> None:
    result = run(RELEVANCE, seeds=[99])
    assert [ch.passages for ch in result] == [(1, 2, 3)]
    assert result[0].score == 3.5
    assert result[0].covered == frozenset({"fall", "perform", "born", "castl"})


def test_a_step_needs_relevance_above_the_mean_and_a_bridge_the_question_did_not_name() -> None:
    # Passage 2 below the candidates' mean: the chain stops at its head.
    assert [ch.passages for ch in run({**RELEVANCE, 2: -0.2}, seeds=[99])] == [(1,)]
    # The performer named by the question is a seed, not a bridge: nothing leads to passage 2.
    assert [ch.passages for ch in run(RELEVANCE, seeds=[10, 99])] == [(1,)]


def test_an_entity_already_used_is_not_followed_back() -> None:
    links = chains.Links.of(PAIRS)
    chain = chains.Chain((1, 2), 2.5, frozenset({99, 10}), TERMS[1] | TERMS[2])
    assert chains.frontier(chain, links) == {20}
    assert chains.reachable([chain], links) == {3}


def test_the_ranking_goes_hop_by_hop_and_keeps_every_head() -> None:
    a = chains.Chain((1, 2, 3), 3.5, frozenset())
    b = chains.Chain((6, 7), 4.0, frozenset())
    # heads first in their own order (8's chain was dropped by the beam), then second hops
    # best chain first, then third hops
    assert chains.ranking([1, 6, 8], [a, b]) == [1, 6, 8, 7, 2, 3]


def test_interleave_gives_equal_slots_and_keeps_each_item_once() -> None:
    assert chains.interleave([1, 2, 3, 4], [1, 2, 9, 8]) == [1, 2, 3, 9, 4, 8]
    assert chains.interleave([], [5]) == [5]
