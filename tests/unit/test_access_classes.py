"""The held graph's access classes (services/retrieval/graph_memory.py, issue 32 step 4): codes
only grow along a holder's states, masks follow ``Caller.can_see``, and a state with evidence of
one relationship in classes whose keys hold None compares as data."""

from __future__ import annotations

import numpy as np

from services.core.access import Caller
from services.retrieval.graph_memory import (
    AccessClasses,
    EntityCounts,
    Evidence,
    MemoryGraph,
    PassageEdges,
    Relationships,
)


def _empty_ids() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def test_codes_grow_and_masks_follow_the_rule() -> None:
    first = AccessClasses.of([(None, None), ("t1", ("g1",))])
    second, codes = first.coded([("t1", ["g1"]), (None, ["g2"]), (None, None)])
    assert codes.tolist() == [1, 2, 0]
    assert (first.size, second.size) == (2, 3)
    assert list(first.keys) == [(None, None), ("t1", ("g1",))]  # older states keep their view
    caller = Caller(groups=frozenset({"g2"}))
    assert first.visible_to(caller).tolist() == [True, False]
    assert second.visible_to(caller).tolist() == [True, False, True]  # the mask extended
    # an older state coding anew starts a line of its own, with the same codes for its keys
    other, again = first.coded([("t2", None)])
    assert again.tolist() == [2]
    assert list(other.keys)[:2] == list(first.keys)


def test_canonical_orders_evidence_whose_class_keys_hold_none() -> None:
    classes = AccessClasses.of([(None, None), (None, ("g1",))])
    empty = _empty_ids()
    graph = MemoryGraph(
        1,
        PassageEdges.sorted_of(
            empty, empty, np.zeros(0, dtype=np.bool_), empty.astype(np.int32),
            empty.astype(np.int32),
        ),
        EntityCounts(empty, empty.astype(np.int32)),
        Relationships.of([]),
        Evidence.of([(7, 1, 1.0, 1), (7, 0, 2.0, 2)]),
        classes,
    )  # fmt: skip
    assert graph.canonical()["evidence"] == [
        (7, (None, ("g1",)), 1.0, 1),
        (7, (None, None), 2.0, 2),
    ]
