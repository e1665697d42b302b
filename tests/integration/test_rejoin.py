"""An indexer evicted from its consumer group (its process stopped past the session timeout, as
a starved event loop would be, while another member joined: tansu expires a silent member's
session when the group changes, not on a timer) consumes again: by rejoining, or, when its
consumer does not rejoin, by exiting through the rejoin watchdog so that a new process
(started here as `kgstream up` or Kubernetes would) resumes from the committed offsets. Every
event ends up applied exactly once either way."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from services.core.settings import Settings
from services.indexer.app import REJOIN_EXIT_CODE
from tests.support.faults import wait_until
from tests.support.graph import processed_count, scalar, wait_processed
from tests.support.workers import (
    Worker,
    publish_lines,
    sample_lines,
    start_worker,
    stop_workers,
    wait_ready,
)

pytestmark = pytest.mark.integration

REJOIN_TIMEOUT_S = 30  # the watchdog's limit here (default: 20 session timeouts, 120 s)
STOPPED_S = 12  # longer than the 6 s session timeout: the broker evicts the member


def _index_half_then_stop(worker: Worker, settings: Settings, lines: list[str]) -> None:
    """The indexer, ready, applies the first 24 events; then its process is stopped past the
    session timeout (the caller sends SIGCONT)."""
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    assert wait_ready([worker], timeout=120), worker.output()[-3000:]
    publish_lines(bootstrap, settings.documents_topic, lines[:24])
    assert wait_processed(url, 24, timeout=180) == 24, worker.output()[-3000:]
    os.kill(worker.pid, signal.SIGSTOP)
    time.sleep(STOPPED_S)


def test_evicted_indexer_consumes_again(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KGSTREAM_INDEXER_REJOIN_TIMEOUT_S", str(REJOIN_TIMEOUT_S))
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic, lines = settings.documents_topic, sample_lines()
    first = start_worker(settings, tmp_path / "indexer-1.log")
    workers = [first]
    try:
        _index_half_then_stop(first, settings, lines)
        try:
            took_over = _join_and_leave(bootstrap, settings.consumer_group, topic)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert took_over, "another member could not join the group of the stopped indexer"
        publish_lines(bootstrap, topic, lines[24:])

        if not _consumes_or_exits(first, url, 48, timeout=REJOIN_TIMEOUT_S + 90):
            pytest.fail(
                f"the evicted indexer neither consumed again nor exited: {processed_count(url)}"
                f" of 48 processed\n{first.output()[-4000:]}"
            )
        if not first.alive():
            # It did not consume again: a watchdog ended it, saying why, for a restart. Either
            # it did not rejoin (membership.py), or it rejoined and its agent got none of the
            # records that waited (fetch_stall.py: seen here on loaded runs).
            assert first.proc.returncode == REJOIN_EXIT_CODE, first.output()[-3000:]
            out = first.output()
            assert f"indexer exiting with code {REJOIN_EXIT_CODE} to be restarted" in out, out
            assert (
                "has not been a member of group" in out
                or "has not handed the agent the records waiting" in out
            ), out
            second = start_worker(settings, tmp_path / "indexer-2.log")
            workers.append(second)
            assert wait_processed(url, 48, timeout=180) == 48, second.output()[-3000:]
        # The fetch watch reads the real consumer's positions (a private path into faust and
        # aiokafka: a moved attribute would turn it off with a warning, not silently).
        last = workers[-1]
        sampled = wait_until(lambda: "fetch watch: first sample" in last.output(), 30)
        assert sampled, last.output()[-3000:]
        assert "fetch watch: sample failed" not in last.output(), last.output()[-3000:]
    finally:
        stop_workers(workers)

    # Redelivered events (acked but not committed before the eviction) are skipped by event_id.
    assert scalar(url, "SELECT count(*) FROM processed_events") == 48
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome <> 'applied'") == 0
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0


class _FaustProtocol(RoundRobinPartitionAssignor):  # type: ignore[misc]
    """Round robin under the protocol name the indexer's group uses (faust's assignor): the
    broker refuses a member whose protocols share none with the group's."""

    name = "faust"


def _member(bootstrap: str, group: str, topic: str, max_poll_interval_ms: int) -> KafkaConsumer:
    """A plain consumer in ``group`` (it joins on its first poll); ``max_poll_interval_ms`` is
    its rebalance timeout: how long a join waits for it to rejoin."""
    return KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1500,
        max_poll_interval_ms=max_poll_interval_ms,
        partition_assignment_strategy=[_FaustProtocol],
    )


def _join_and_leave(bootstrap: str, group: str, topic: str, timeout: float = 90) -> bool:
    """Join ``group`` as a plain consumer until the broker assigns it partitions (evicting the
    stopped member, whose session has expired), then leave without committing anything."""
    consumer = _member(bootstrap, group, topic, max_poll_interval_ms=10000)
    try:
        deadline = time.monotonic() + timeout
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=500, max_records=1)
        return bool(consumer.assignment())
    finally:
        consumer.close(autocommit=False)


def _consumes_or_exits(worker: Worker, url: str, n: int, timeout: float) -> bool:
    """Wait until ``n`` events are processed or the worker exits (False: neither in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if processed_count(url) >= n or not worker.alive():
            return True
        time.sleep(0.5)
    return False


def test_indexer_kept_out_of_its_group_exits_for_a_restart(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While the indexer is stopped, another member takes the group and then stops polling: the
    # broker keeps the indexer's rejoin waiting for that member, longer than the 4 s limit.
    monkeypatch.setenv("KGSTREAM_INDEXER_REJOIN_TIMEOUT_S", "4")
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic, lines = settings.documents_topic, sample_lines()
    first = start_worker(settings, tmp_path / "indexer-1.log")
    workers = [first]
    other = _member(bootstrap, settings.consumer_group, topic, max_poll_interval_ms=60000)
    try:
        _index_half_then_stop(first, settings, lines)
        try:
            deadline = time.monotonic() + 90
            while not other.assignment() and time.monotonic() < deadline:
                other.poll(timeout_ms=500, max_records=1)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert other.assignment(), "another member could not join the group"
        first.proc.wait(timeout=90)
        out = first.output()
        assert first.proc.returncode == REJOIN_EXIT_CODE, out[-3000:]
        assert f"indexer exiting with code {REJOIN_EXIT_CODE} to be restarted" in out, out
        assert "consumer state: " in out, out
    finally:
        other.close(autocommit=False)
        stop_workers(workers)
    # What the restarted process does is not checked here: on tansu, a new indexer did not
    # join this group within 3 minutes after the other member left (a group left with a member
    # that died mid-join; not investigated). test_evicted_indexer_consumes_again checks that
    # every event is applied exactly once after an eviction.
    assert scalar(url, "SELECT count(*) FROM processed_events") == 24
