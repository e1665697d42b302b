"""How `kgstream up` supervises (services/cli/supervisor.py, restarts.py, infra_watch.py), on a
fake clock, fake processes and a fake infrastructure manager."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, cast

import pytest

from services.cli.infra_watch import InfraWatch
from services.cli.restarts import RestartPolicy
from services.cli.supervisor import STOP_GRACE_S, WORKERS, Stack
from services.core.infra.manager import ComponentState, Endpoints, InfraState
from services.core.settings import Settings

OLD = Endpoints("postgresql+psycopg://u@127.0.0.1:5000/db", "127.0.0.1:9000")


def test_restart_backoff_doubles_to_a_cap_and_counts_a_crash_loop() -> None:
    policy = RestartPolicy(base_s=1, cap_s=4, stable_s=60, max_quick=4)
    policy.on_start(0)
    delays = [policy.on_exit(t) for t in (1, 2, 3, 4)]
    assert delays == [1, 2, 4, 4]
    assert not policy.crash_looping
    assert policy.on_exit(5) == 4  # still restarted, at the cap
    assert policy.crash_looping


def test_restart_backoff_resets_after_a_stable_run() -> None:
    policy = RestartPolicy(base_s=1, cap_s=30, stable_s=60, max_quick=2)
    policy.on_start(0)
    assert policy.on_exit(1) == 1
    policy.on_start(2)
    assert policy.on_exit(3) == 2
    policy.on_start(5)
    assert policy.on_exit(500) == 1  # it ran for 495 s: a new count
    assert not policy.crash_looping


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, cast(int | None, None)
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr("services.cli.supervisor.time.monotonic", lambda: now[0])
    return now


def fake_stack(monkeypatch: pytest.MonkeyPatch, clock: list[float]) -> tuple[Stack, list[str]]:
    """A stack whose ``start`` makes fake processes (pids 1, 2, ...), all workers started."""
    started: list[str] = []
    stack = Stack(OLD, "http://api")

    def start(name: str) -> None:
        started.append(name)
        stack.processes[name] = cast(Any, FakeProc(len(started)))
        stack.restarts.setdefault(name, RestartPolicy()).on_start(clock[0])  # as Stack.start

    monkeypatch.setattr(stack, "start", start)
    for name in WORKERS:
        start(name)
    return stack, started


def test_every_worker_is_restarted_after_its_backoff(
    monkeypatch: pytest.MonkeyPatch, clock: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    stack, started = fake_stack(monkeypatch, clock)
    stack.ready = True
    for name in WORKERS:
        cast(FakeProc, stack.processes[name]).returncode = -9
    stack.check_alive()  # noticed: each restarts in 1 s
    assert started == list(WORKERS)
    err = capsys.readouterr().err
    for name in WORKERS:
        assert f"the {name} process exited with code -9: restarting it in 1 s" in err
    clock[0] += 1
    stack.check_alive()
    assert started == [*WORKERS, *WORKERS]
    assert all(proc.poll() is None for proc in stack.processes.values())
    assert "restarted the communities process (pid 5)" in capsys.readouterr().err


def test_a_crash_loop_is_reported_and_retried_at_the_cap_once_the_stack_was_ready(
    monkeypatch: pytest.MonkeyPatch, clock: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    stack, started = fake_stack(monkeypatch, clock)
    stack.ready = True
    for _ in range(8):  # each run ends within a second of its start
        cast(FakeProc, stack.processes["query-api"]).returncode = 1
        stack.check_alive()
        clock[0] += 30
        stack.check_alive()
    assert started.count("query-api") == 9
    err = capsys.readouterr().err
    assert "CRASH LOOP: the query-api process exited 6 times in a row within 60 s" in err
    assert "the query-api process exited with code 1: restarting it in 30 s" in err


def test_a_crash_loop_before_the_stack_was_ready_ends_it(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    stack, _ = fake_stack(monkeypatch, clock)
    for _ in range(5):
        cast(FakeProc, stack.processes["query-api"]).returncode = 1
        stack.check_alive()
        clock[0] += 16
        stack.check_alive()
    cast(FakeProc, stack.processes["query-api"]).returncode = 1
    with pytest.raises(RuntimeError, match="query-api process exited with code 1, 6 times"):
        stack.check_alive()


class FakeInfra:
    """``infra_status``/``infra_up`` of services/core/infra/manager.py over a pid table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pids = {"postgres": 11, "broker": 12}
        self.alive = {11, 12}
        self.ups = 0
        self.endpoints = OLD
        for name in ("infra_status", "infra_up", "resolve_endpoints", "pid_alive"):
            monkeypatch.setattr(f"services.cli.infra_watch.{name}", getattr(self, name))

    def infra_status(self, _settings: Settings) -> InfraState:
        def state(name: str) -> ComponentState:
            return ComponentState(name, True, "x", self.pids[name] in self.alive, self.pids[name])

        return InfraState("home", "infra.json", state("postgres"), state("broker"))

    def infra_up(self, _settings: Settings) -> None:
        self.ups += 1
        self.pids["broker"] = 13
        self.alive.add(13)

    def resolve_endpoints(self, _settings: Settings) -> Endpoints:
        return self.endpoints

    def pid_alive(self, pid: int) -> bool:
        return pid in self.alive


def test_a_dead_broker_up_started_is_restarted_and_its_loss_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    infra = FakeInfra(monkeypatch)
    watch = InfraWatch(Settings(home=tmp_path), owned=True)
    assert watch.check(0) is None
    infra.alive.discard(12)
    assert watch.check(10) is None  # noticed: restart in 1 s
    err = capsys.readouterr().err
    assert "the embedded broker (pid 12) is gone" in err
    assert "those the indexer had not consumed yet are lost" in err
    assert infra.ups == 0
    assert watch.check(11) == OLD
    assert infra.ups == 1
    assert "restarted the embedded servers" in capsys.readouterr().err
    assert watch.check(12) is None  # the new broker (pid 13) is watched
    assert infra.ups == 1


def test_a_dead_server_up_did_not_start_is_only_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    infra = FakeInfra(monkeypatch)
    watch = InfraWatch(Settings(home=tmp_path), owned=False)
    infra.alive.discard(11)
    for now in (10, 20, 100):
        assert watch.check(now) is None
    assert infra.ups == 0
    err = capsys.readouterr().err
    assert err.count("the embedded PostgreSQL (pid 11) is gone") == 1
    assert "`kgstream infra up` starts it again" in err


def test_workers_are_restarted_when_a_restarted_server_moved(
    monkeypatch: pytest.MonkeyPatch, clock: list[float], tmp_path: Path
) -> None:
    infra = FakeInfra(monkeypatch)
    stack, _ = fake_stack(monkeypatch, clock)
    stack.infra = InfraWatch(Settings(home=tmp_path), owned=True)
    infra.endpoints = Endpoints(OLD.database_url, "127.0.0.1:9001")
    infra.alive.discard(12)
    stack.check_alive()
    clock[0] += 1
    stack.check_alive()
    assert stack.endpoints == infra.endpoints
    assert stack.env["KGSTREAM_KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9001"
    for proc in stack.processes.values():
        assert cast(FakeProc, proc).signals == [signal.SIGTERM]


def test_a_planned_restart_is_no_crash(
    monkeypatch: pytest.MonkeyPatch, clock: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    """Review of issue 18, finding 2: workers stopped with SIGTERM because the servers moved
    counted as quick exits: the backoff grew and, after six moves, CRASH LOOP was printed."""
    stack, started = fake_stack(monkeypatch, clock)
    stack.ready = True
    for port in range(9001, 9009):  # eight moves, each a second after the last
        stack.move_to(Endpoints(OLD.database_url, f"127.0.0.1:{port}"))
        for proc in stack.processes.values():
            assert cast(FakeProc, proc).signals == [signal.SIGTERM]
            cast(FakeProc, proc).returncode = -15
        stack.check_alive()  # restarted at once, not after a backoff
        assert all(proc.poll() is None for proc in stack.processes.values())
        clock[0] += 1
    assert len(started) == 9 * len(WORKERS)
    assert all(policy.quick == 0 for policy in stack.restarts.values())
    err = capsys.readouterr().err
    assert "CRASH LOOP" not in err
    assert "restarting it in" not in err
    # A crash after the moves starts from the base backoff.
    cast(FakeProc, stack.processes["indexer"]).returncode = 1
    stack.check_alive()
    assert "the indexer process exited with code 1: restarting it in 1 s" in capsys.readouterr().err


def test_a_worker_that_ignores_sigterm_is_killed(
    monkeypatch: pytest.MonkeyPatch, clock: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    stack, started = fake_stack(monkeypatch, clock)
    stack.ready = True
    stack.move_to(Endpoints(OLD.database_url, "127.0.0.1:9001"))
    for name in ("indexer", "communities"):  # these stop; the query API ignores SIGTERM
        cast(FakeProc, stack.processes[name]).returncode = -15
    stack.check_alive()
    api = cast(FakeProc, stack.processes["query-api"])
    clock[0] += STOP_GRACE_S - 1
    stack.check_alive()
    assert api.signals == [signal.SIGTERM]
    clock[0] += 1
    stack.check_alive()
    assert api.signals == [signal.SIGTERM, signal.SIGKILL]
    assert "the query-api process ignored SIGTERM for 30 s: killing it" in capsys.readouterr().err
    clock[0] += 60
    stack.check_alive()
    assert api.signals == [signal.SIGTERM, signal.SIGKILL]  # killed once
    api.returncode = -9
    stack.check_alive()  # a planned restart still: at once, no backoff
    assert started.count("query-api") == 2
    assert stack.restarts["query-api"].quick == 0
