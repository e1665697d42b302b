"""Read replicas without a database (issue 20): the replica URLs setting and its errors, the lag
rule, what a read must see, when a replica is usable, and the status lines."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from services.cli.status_view import render
from services.core.errors import ConfigurationError
from services.core.replication import ReplicaLag, ReplicaPosition, lag_of, parse_lsn
from services.core.settings import Settings
from services.retrieval.replica_monitor import ReadPolicy, Replica
from services.retrieval.replicas import ReadState, Wanted


def test_read_urls_are_normalised_and_listed() -> None:
    settings = Settings(database_read_url=" postgres://u:p@a:5432/kg ,postgresql://u:p@b/kg")
    assert settings.database_read_urls == [
        "postgresql+psycopg://u:p@a:5432/kg",
        "postgresql+psycopg://u:p@b/kg",
    ]
    assert Settings(database_read_url="").database_read_urls == []
    assert Settings().database_read_urls == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mysql://u:secret@a/kg", "'mysql://u:***@a/kg' is not a PostgreSQL URL"),
        ("postgresql://u:secret@a:5432", "names no database"),
        ("kg-replica", "'kg-replica' is not a URL"),
        ("postgresql:///kg", "names no host"),
        ("postgresql://u:p@a/kg,postgres://u:p@a/kg", "names the same replica twice"),
    ],
)
def test_a_bad_read_url_is_a_clear_error_without_its_password(value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match="KGSTREAM_DATABASE_READ_URL") as caught:
        Settings(database_read_url=value)
    assert message in str(caught.value)
    assert "secret" not in str(caught.value)


def test_the_wait_must_fit_in_the_request_budget() -> None:
    with pytest.raises(ConfigurationError, match="KGSTREAM_READ_WAIT_MAX_S"):
        Settings(read_wait_max_s=30, query_timeout_s=30)
    assert Settings(read_wait_max_s=5, query_timeout_s=30).read_wait_max_s == 5


def test_lsn_text_is_a_byte_offset() -> None:
    assert parse_lsn("0/3000000") == 0x3000000
    assert parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848


def _at(lsn: int | None, age: float | None, *, recovery: bool = True) -> ReplicaPosition:
    return ReplicaPosition(in_recovery=recovery, replay_lsn=lsn, replay_age_s=age, paused=False)


def test_lag_by_the_rule() -> None:
    caught_up = lag_of("r", "db", _at(100, 500.0), primary_lsn=100)
    assert (caught_up.lag_bytes, caught_up.lag_s) == (0, 0.0)  # an idle system is not behind
    ahead = lag_of("r", "db", _at(120, 500.0), primary_lsn=100)  # read after the primary
    assert (ahead.lag_bytes, ahead.lag_s) == (0, 0.0)
    behind = lag_of("r", "db", _at(100, 500.0), primary_lsn=160)
    assert (behind.lag_bytes, behind.lag_s) == (60, 500.0)
    tighter = lag_of("r", "db", _at(100, 500.0), primary_lsn=160, reached_s=1.5)
    assert tighter.lag_s == 1.5  # the primary was at 100 1.5 s ago: two upper bounds, the least
    unknown = lag_of("r", "db", _at(100, None), primary_lsn=160)
    assert (unknown.lag_bytes, unknown.lag_s) == (60, None)  # nothing replayed since it started
    no_primary = lag_of("r", "db", _at(100, 2.0), primary_lsn=None)
    assert (no_primary.lag_bytes, no_primary.lag_s) == (None, 2.0)
    not_standby = lag_of("r", "db", _at(None, None, recovery=False), primary_lsn=160)
    assert (not_standby.in_recovery, not_standby.lag_s) == (False, 0.0)
    starting = lag_of("r", "db", _at(None, None), primary_lsn=160)
    assert starting.error == "nothing replayed yet"


def test_a_record_held_at_a_page_end_is_not_lag() -> None:
    # Seen with PostgreSQL 18: an idle primary flushed to 0/3014000 (a page boundary), the
    # standby received it all and replayed to 0/3013EF0 until the next write arrived.
    held = ReplicaPosition(True, 0x3013EF0, 8.1, False, receive_lsn=0x3014000)
    at_end = lag_of("r", "db", held, primary_lsn=0x3014000, reached_s=8.0)
    assert (at_end.lag_bytes, at_end.lag_s) == (272, 0.0)
    paused = ReplicaPosition(True, 0x3013EF0, 8.1, True, receive_lsn=0x3014000)
    assert lag_of("r", "db", paused, primary_lsn=0x3014000).lag_s == 8.1
    mid_page = ReplicaPosition(True, 0x3013EF0, 8.1, False, receive_lsn=0x3013F80)
    assert lag_of("r", "db", mid_page, primary_lsn=0x3013F80).lag_s == 8.1
    not_all_received = ReplicaPosition(True, 0x3013EF0, 8.1, False, receive_lsn=0x3014000)
    assert lag_of("r", "db", not_all_received, primary_lsn=0x3016000).lag_s == 8.1


def test_what_a_read_must_see() -> None:
    seen = ReadState(snapshot_id=7, has_event=False)
    assert not Wanted()
    assert Wanted().met_by(ReadState(None, False))
    assert Wanted(min_snapshot=7).met_by(seen)
    assert not Wanted(min_snapshot=8).met_by(seen)
    assert not Wanted(min_snapshot=1).met_by(ReadState(None, True))  # no snapshot yet
    assert not Wanted(after_event="e").met_by(seen)
    assert Wanted(min_snapshot=7, after_event="e").met_by(ReadState(7, True))
    assert Wanted(8, "e").describe() == "snapshot >= 8 and event 'e' applied"
    assert Wanted(8).to_dict() == {"min_snapshot": 8, "after_event": None}


def _replica() -> Replica:
    url = "postgresql+psycopg://u:secret@r:5432/kg"
    return Replica("replica-1", url, create_async_engine(url))


def test_a_replica_is_usable_when_checked_recently_close_enough_and_not_taken_out() -> None:
    policy = ReadPolicy(max_lag_s=3.0, check_s=1.0, check_budget_s=0.8, retry_s=5.0)
    replica, now = _replica(), time.monotonic()
    assert not replica.usable(now, policy)  # not checked yet
    assert replica.report(now, policy)["error"] == "not checked yet"
    replica.checked = (ReplicaLag("replica-1", "db", True, False, 10, 2.5), now)
    assert replica.usable(now, policy)
    assert not replica.usable(now + 3.0, policy)  # the check is too old (2 x 1 s + 0.8 s)
    replica.checked = (ReplicaLag("replica-1", "db", True, False, 10, 3.5), now)
    assert not replica.usable(now, policy)  # behind the max lag
    replica.checked = (ReplicaLag("replica-1", "db", error="refused"), now)
    assert not replica.usable(now, policy)
    replica.checked = (ReplicaLag("replica-1", "db", True, False, 0, 0.0), now)
    replica.take_out("connection lost", policy.retry_s)
    assert not replica.usable(now, policy)  # until a check after its time out
    taken_out_at = replica.out[0] - policy.retry_s  # the replica's own clock reading
    report = replica.report(taken_out_at + 1.0, policy)
    assert report["error"] == "connection lost"
    assert report["out_for_s"] == 4.0
    assert "secret" not in replica.database
    later = replica.out[0] + 0.1
    replica.checked = (ReplicaLag("replica-1", "db", True, False, 0, 0.0), later)
    assert replica.usable(later, policy)


def test_status_lines_name_each_replica_and_why_it_is_not_used() -> None:
    lines = render_replicas(
        [
            {"name": "replica-1", "database": "postgresql+psycopg://u:***@a/kg", "error": "",
             "lag_bytes": 4096, "lag_s": 0.25, "replay_paused": False, "usable": True},
            {"name": "replica-2", "database": "postgresql+psycopg://u:***@b/kg", "error": "",
             "lag_bytes": 9000, "lag_s": 12.0, "replay_paused": True, "usable": False},
            {"name": "replica-3", "database": "postgresql+psycopg://u:***@c/kg",
             "error": "OperationalError: connection refused", "lag_bytes": None, "lag_s": None},
        ]
    )  # fmt: skip
    assert lines[0].endswith(
        "replica-1 postgresql+psycopg://u:***@a/kg lag 4096 bytes, 0.25s: used"
    )
    assert lines[1].endswith("lag 9000 bytes, 12s, replay paused: NOT USED (behind the max lag)")
    assert lines[2].endswith("NOT USED: OperationalError: connection refused")


def render_replicas(replicas: list[dict[str, object]]) -> list[str]:
    """The replica lines of `kgstream status` for a document with only ``replicas``."""
    rendered = render({"replicas": replicas, **_EMPTY_STATUS}).splitlines()
    return [line for line in rendered if line.lstrip().startswith("replica:")]


_EMPTY_STATUS: dict[str, object] = {
    "throughput": {"1m": {"applied_per_s": 0, "applied": 0, "handled": 0},
                   "5m": {"applied_per_s": 0, "applied": 0}},
    "freshness": {"window_s": 600, **{f"since_{s}": {"p50_s": None, "p99_s": None, "events": 0}
                                      for s in ("occurred", "published")}},
    "change": {"ratio": 0.0, "threshold": 0.1, "over_threshold": False},
    "dead_letters_by_reason": {}, "snapshots": [], "tokens": [], "indexer": {"partitions": []},
}  # fmt: skip
