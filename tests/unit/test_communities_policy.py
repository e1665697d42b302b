"""Change-ratio arithmetic and when the worker recomputes (docs/architecture.md, "Communities and
snapshots")."""

from __future__ import annotations

import dataclasses

import pytest

from services.communities.policy import Policy, decide
from services.core.change_state import ChangeState, change_ratio

POLICY = Policy(threshold=0.10, min_interval_s=30, max_staleness_s=3600)
QUIET = ChangeState(
    snapshot_id=1,
    changed=0,
    snapshot_size=1000,
    graph_empty=False,
    since_publish_s=60,
    since_last_run_s=60,
    requested=False,
)


def test_ratio_is_distinct_changes_over_snapshot_nodes_plus_edges() -> None:
    assert change_ratio(changed=50, snapshot_size=1000, graph_empty=False) == 0.05
    assert change_ratio(changed=101, snapshot_size=1000, graph_empty=False) == pytest.approx(0.101)
    # More changes than the snapshot had elements (churn on new things) go above 1.
    assert change_ratio(changed=3000, snapshot_size=1000, graph_empty=False) == 3.0


def test_ratio_before_the_first_snapshot_and_on_empty_ones() -> None:
    assert change_ratio(changed=7, snapshot_size=None, graph_empty=False) == 1.0
    assert change_ratio(changed=0, snapshot_size=None, graph_empty=True) == 0.0
    assert change_ratio(changed=4, snapshot_size=0, graph_empty=False) == 1.0
    assert change_ratio(changed=0, snapshot_size=0, graph_empty=True) == 0.0


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, None),
        ({"changed": 100}, None),  # exactly at the threshold: not above it
        ({"changed": 101}, "threshold"),
        ({"changed": 101, "since_last_run_s": 10}, None),  # minimum interval
        ({"requested": True}, "requested"),
        ({"requested": True, "since_last_run_s": 5}, None),
        ({"withheld": 3}, "erasure"),  # far below the threshold: a delete hit a summary
        ({"withheld": 3, "since_last_run_s": 5}, None),
        ({"withheld": 3, "requested": True}, "requested"),
        ({"changed": 1, "since_publish_s": 3600}, "staleness"),
        ({"changed": 0, "since_publish_s": 99999}, None),  # stale but unchanged
        ({"snapshot_id": None, "snapshot_size": None, "since_publish_s": None}, "first_build"),
        (
            {
                "snapshot_id": None,
                "snapshot_size": None,
                "graph_empty": True,
                "since_last_run_s": None,
            },
            None,
        ),
        ({"snapshot_id": None, "snapshot_size": None, "since_last_run_s": None}, "first_build"),
    ],
)
def test_decide(changes: dict[str, object], expected: str | None) -> None:
    state = dataclasses.replace(QUIET, **changes)  # type: ignore[arg-type]
    assert decide(state, POLICY) == expected
