"""When a partition counts as stalled (pure rule)."""

from __future__ import annotations

from services.core.indexer_health import PartitionProgress, health, is_stalled


def progress(**fields: object) -> PartitionProgress:
    base: dict[str, object] = {
        "consumer_group": "g",
        "topic": "docs",
        "partition": 0,
        "next_offset": 10,
        "handled_total": 10,
        "idle_s": 500.0,
        "retrying_for_s": None,
        "last_error": None,
    }
    base.update(fields)
    return PartitionProgress(**base)  # type: ignore[arg-type]


def test_idle_with_nothing_waiting_is_not_stalled() -> None:
    assert not is_stalled(progress(), end_offset=10, stall_after_s=60)
    assert not is_stalled(progress(), end_offset=None, stall_after_s=60)


def test_records_waiting_on_a_still_offset_is_stalled() -> None:
    assert is_stalled(progress(), end_offset=11, stall_after_s=60)
    assert not is_stalled(progress(idle_s=5.0), end_offset=11, stall_after_s=60)


def test_retrying_too_long_is_stalled_even_without_lag() -> None:
    assert is_stalled(progress(idle_s=1.0, retrying_for_s=61.0), end_offset=None, stall_after_s=60)
    assert not is_stalled(
        progress(idle_s=1.0, retrying_for_s=3.0), end_offset=None, stall_after_s=60
    )


def test_health_reports_lag_and_overall_state() -> None:
    doc = health([progress(), progress(partition=1, next_offset=4)], {("docs", 1): 9}, 60)
    assert doc["stalled"] is True
    assert [(p["partition"], p["lag"], p["stalled"]) for p in doc["partitions"]] == [
        (0, None, False),
        (1, 5, True),
    ]
