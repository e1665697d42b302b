from __future__ import annotations

import math

import numpy as np
import pytest

from services.retrieval.ranking import mention_weight
from services.retrieval.reseed import (
    bridge_seeds,
    passage_counts,
    reached_passages,
    split_reset,
)


def test_mention_weight_discounts_common_entities() -> None:
    weights = mention_weight(np.array([1, 10, 200, 0], dtype=np.int64))
    assert weights[0] == pytest.approx(1 / math.log(2))
    assert weights[0] > weights[1] > weights[2]
    assert weights[3] == weights[0]  # df is at least 1


def test_bridge_seeds_are_the_unnamed_entities_of_the_top_passages() -> None:
    mentions = [(1, 10), (2, 10), (2, 20), (3, 30), (4, 10), (4, 20), (4, 30), (2, 10)]
    assert passage_counts(mentions) == {1: 1, 2: 2, 3: 1, 4: 3}
    seeds = bridge_seeds([10], mentions, known=[1], total_chunks=100)
    assert set(seeds) == {2, 4}
    assert seeds[2] > seeds[4]  # the rarer bridge weighs more
    assert seeds[2] == pytest.approx(math.log(101 / 3 + 1))
    assert bridge_seeds([99], mentions, known=[], total_chunks=100) == {}


def test_split_reset_gives_each_seed_set_half_the_mass() -> None:
    out = split_reset({1: 3.0, 2: 1.0}, {2: 1.0, 5: 1.0, 6: 0.0})
    assert out == pytest.approx({1: 0.75, 2: 0.75, 5: 0.5})
    assert sum(out.values()) == pytest.approx(2.0)
    assert split_reset({1: 2.0}, {}) == {1: 1.0}


def test_reached_passages() -> None:
    mentions = [(1, 10), (2, 10), (2, 20), (2, 40), (3, 30)]
    assert reached_passages([2], mentions, skip=[10]) == [20, 40]
    assert reached_passages([9], mentions, skip=[]) == []
