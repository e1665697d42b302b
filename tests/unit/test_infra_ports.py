"""Pure parts of the embedded infrastructure: ports, pids, state and endpoint resolution."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.core.infra.errors import InfraError, log_tail
from services.core.infra.manager import (
    Endpoints,
    default_topics,
    infra_status,
    resolve_endpoints,
)
from services.core.infra.ports import (
    free_port,
    pid_alive,
    port_answers,
    port_is_free,
    split_host_port,
)
from services.core.infra.postgres import EmbeddedPostgres
from services.core.settings import Settings


def test_free_port_is_bindable_and_nobody_answers() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    assert port_is_free(port)
    assert not port_answers(port, timeout=0.2)


def test_listening_port_is_not_free_and_answers() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not port_is_free(port)
        assert port_answers(port)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9092", ("127.0.0.1", 9092)),
        ("[::1]:19092", ("::1", 19092)),
        (" kafka:9093 ", ("kafka", 9093)),
    ],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["kafka", "kafka:", ":9092", "kafka:x"])
def test_split_host_port_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        split_host_port(address)


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(0)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert log_tail(log, 2) == "line 48\nline 49"
    assert "no log" in log_tail(tmp_path / "missing.log")


def _settings(home: Path, **kw: str | None) -> Settings:
    values: dict[str, str | None] = {"database_url": None, "kafka_bootstrap_servers": None}
    values.update(kw)
    return Settings(home=home, **values)  # type: ignore[arg-type]


def test_resolve_endpoints_prefers_configured(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        database_url="postgres://u:secret@db:5432/kg",
        kafka_bootstrap_servers="kafka:9092",
    )
    endpoints = resolve_endpoints(settings)
    assert endpoints == Endpoints("postgresql+psycopg://u:secret@db:5432/kg", "kafka:9092")
    assert "secret" not in str(endpoints.to_dict())


def test_resolve_endpoints_without_servers_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match="kgstream infra up"):
        resolve_endpoints(_settings(tmp_path))


def test_stale_state_file_is_not_alive(tmp_path: Path) -> None:
    (tmp_path / "infra.json").write_text(
        '{"broker": {"endpoint": "127.0.0.1:1", "pid": 999999999, "port": 1}}'
    )
    settings = _settings(tmp_path, database_url="postgresql://x@127.0.0.1:1/x")
    state = infra_status(settings)
    assert state.broker.managed
    assert not state.broker.alive
    assert not state.postgres.managed
    assert not state.postgres.alive
    assert state.to_dict()["broker"]["pid"] == 999999999
    with pytest.raises(InfraError, match="broker"):
        resolve_endpoints(settings)


def test_default_topics_follow_settings(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, topic_partitions=6)
    topics = default_topics(settings)
    assert topics[settings.documents_topic] == 6
    assert topics[settings.snapshots_topic] == 1


def test_embedded_shared_buffers_from_settings_and_checked(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, embedded_shared_buffers="2GB")
    pg = EmbeddedPostgres.from_settings(settings)
    assert pg.shared_buffers == "2GB"
    pg.data_dir.mkdir(parents=True)
    pg._write_conf(5432)  # what every start writes
    assert "shared_buffers = '2GB'" in (pg.data_dir / "kgstream.conf").read_text()
    assert EmbeddedPostgres(tmp_path).shared_buffers == "128MB"  # PostgreSQL's own default
    for bad in ("2 GB", "0MB", "1GB'\nlisten_addresses = '*"):
        with pytest.raises(InfraError, match="shared_buffers"):
            EmbeddedPostgres(tmp_path, shared_buffers=bad)
        with pytest.raises(ValidationError):
            Settings(embedded_shared_buffers=bad)
