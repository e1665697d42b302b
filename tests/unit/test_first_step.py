"""Local mode's first passage-entity step (services/retrieval/neighbourhood.first_step): the
seeds always, their neighbours rarest first within the same link budget as the bridge step."""

from __future__ import annotations

from services.retrieval.neighbourhood import MAX_BRIDGE_MENTIONS, first_step


def test_seeds_always_then_rarest_neighbours_within_the_budget() -> None:
    half = MAX_BRIDGE_MENTIONS // 2
    ranked = [(5, 1), (6, 2), (7, half), (1, half), (8, half)]  # rarest first; 1 is the seed
    # the seed's links count first; 7 would take them past the budget, and so would 8
    assert first_step(ranked, [1]) == [1, 5, 6]
    assert first_step(ranked, [8, 1]) == [1, 8]  # two seeds at half each fill it


def test_a_seed_beyond_the_budget_is_still_read() -> None:
    ranked = [(3, 10), (9, MAX_BRIDGE_MENTIONS + 1)]
    assert first_step(ranked, [9]) == [9]
    assert first_step(ranked, []) == [3]


def test_everything_fits_on_a_small_graph() -> None:
    ranked = [(e, 3) for e in range(10)]
    assert first_step(ranked, [4]) == [4, *[e for e in range(10) if e != 4]]
