"""Embedded PostgreSQL and tansu, started in a temporary home on free ports."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from sqlalchemy.engine import make_url

from services.core.infra import postgres
from services.core.infra.broker import EmbeddedBroker
from services.core.infra.manager import (
    InfraState,
    default_topics,
    infra_down,
    infra_status,
    infra_up,
    resolve_endpoints,
)
from services.core.infra.ports import pid_alive, port_answers
from services.core.infra.postgres import ADMIN_USER, DB_NAME, DB_USER, EmbeddedPostgres
from services.core.infra.topics import ensure_topics
from services.core.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("kgstream-home")
    yield Settings(home=home, database_url=None, kafka_bootstrap_servers=None)
    # Whatever a failing test left behind: no servers, no data in /var/tmp.
    EmbeddedBroker(home).stop()
    EmbeddedPostgres(home).purge()


@pytest.fixture(scope="module")
def state(settings: Settings) -> InfraState:
    return infra_up(settings)


def _partitions(bootstrap: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (described,) = admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        admin.close()


def test_up_starts_both_on_loopback(state: InfraState, settings: Settings) -> None:
    assert state.postgres.managed
    assert state.postgres.alive
    assert state.broker.managed
    assert state.broker.alive
    url = make_url(state.postgres.endpoint or "")
    assert (url.drivername, url.username, url.host, url.port, url.database) == (
        "postgresql+psycopg",
        "kgstream",
        "127.0.0.1",
        state.postgres.port,
        "kgstream",
    )
    assert url.password == EmbeddedPostgres(settings.home_dir).password("kgstream")
    assert "kgstream:***@" in str(state.to_dict()["postgres"]["endpoint"])  # masked when shown
    assert state.broker.endpoint == f"127.0.0.1:{state.broker.port}"
    assert resolve_endpoints(settings).kafka_bootstrap_servers == state.broker.endpoint
    if os.geteuid() == 0:
        # initdb refuses root: the data lives where the unprivileged user can reach it.
        assert state.postgres.data_dir is not None
        assert not Path(state.postgres.data_dir).is_relative_to(settings.home_dir)
    for topic, partitions in default_topics(settings).items():
        assert _partitions(state.broker.endpoint, topic) == partitions


def test_second_up_reuses_running_servers(state: InfraState, settings: Settings) -> None:
    again = infra_up(settings)
    assert again.postgres.pid == state.postgres.pid
    assert again.broker.pid == state.broker.pid


def test_extensions_can_be_created(state: InfraState) -> None:
    assert state.postgres.endpoint is not None
    dsn = state.postgres.endpoint.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        row = conn.execute(
            "SELECT '[1,2,3]'::vector <-> '[1,2,4]'::vector, similarity('kgstream', 'kgstreams')"
        ).fetchone()
        assert row is not None
        assert row[0] == pytest.approx(1.0)
        assert 0.5 < row[1] < 1.0
        assert conn.execute("SHOW maintenance_work_mem").fetchone() == ("1GB",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)


def _libpq(endpoint: str | None) -> str:
    assert endpoint is not None
    return endpoint.replace("postgresql+psycopg://", "postgresql://")


def test_the_service_role_is_no_superuser(state: InfraState) -> None:
    """Issue 8, finding 7: the embedded role was a superuser that trusted every local
    connection. The service's role now cannot reach the server's files or programs."""
    with psycopg.connect(_libpq(state.postgres.endpoint), autocommit=True) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == (False,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_read_file('pg_hba.conf')")


@pytest.mark.parametrize("user", [DB_USER, ADMIN_USER])
def test_no_connection_without_the_password(state: InfraState, user: str) -> None:
    port = state.postgres.port
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"host=127.0.0.1 port={port} user={user} dbname={DB_NAME}")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(f"host=127.0.0.1 port={port} user={user} password=wrong dbname={DB_NAME}")


def test_passwords_and_state_are_private(state: InfraState, settings: Settings) -> None:
    secrets = settings.home_dir / "secrets"
    assert secrets.stat().st_mode & 0o777 == 0o700
    for path in secrets.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert Path(state.state_file).stat().st_mode & 0o777 == 0o600


def test_a_cluster_from_an_older_kgstream_gets_passwords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: initdb with trust, bootstrap superuser ``kgstream`` owning the database. At the
    next start it requires passwords and keeps its data; its role stays a superuser
    (PostgreSQL cannot demote the bootstrap superuser), and the start says so."""
    pg = EmbeddedPostgres(tmp_path / "home")
    try:
        with monkeypatch.context() as old:
            old.setattr(postgres, "ADMIN_USER", DB_USER)  # the old initdb made kgstream super
            old.setattr(EmbeddedPostgres, "_secure", lambda _: None)
            old.setattr(EmbeddedPostgres, "_ensure_database", lambda _: None)
            old.setattr(EmbeddedPostgres, "_service_role_is_superuser", lambda _: False)
            pg.start()
            trust = f"host=127.0.0.1 port={pg.port} user={DB_USER} dbname=postgres"
            with psycopg.connect(trust, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{DB_NAME}"')
            with psycopg.connect(trust.replace("postgres", DB_NAME), autocommit=True) as conn:
                conn.execute("CREATE TABLE kept (x int)")
                conn.execute("INSERT INTO kept VALUES (42)")
            pg.stop()
        url = pg.start()
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            assert conn.execute("SELECT x FROM kept").fetchone() == (42,)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(trust)
        assert "infra down --purge" in caplog.text
        pg.stop()
        caplog.clear()
        assert pg.start() == url  # a second start: already secured, still warned
        assert "infra down --purge" in caplog.text
    finally:
        pg.purge()


def test_produce_and_consume(state: InfraState) -> None:
    assert importlib.util.find_spec("crc32c") is not None, "kafka-python needs crc32c"
    bootstrap = state.broker.endpoint
    assert bootstrap is not None
    ensure_topics(bootstrap, {"it.roundtrip": 1})
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send("it.roundtrip", key=b"doc-1", value=b'{"hello": "world"}').get(timeout=60)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    partition = TopicPartition("it.roundtrip", 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    records: list[Any] = []
    deadline = time.monotonic() + 60  # a bound for a broken run, not a measure
    while not records and time.monotonic() < deadline:
        records = [r for batch in consumer.poll(timeout_ms=500).values() for r in batch]
    consumer.close()
    assert [(r.key, r.value) for r in records] == [(b"doc-1", b'{"hello": "world"}')]


def test_ensure_topics_explicit_partitions(state: InfraState) -> None:
    bootstrap = state.broker.endpoint
    assert bootstrap is not None
    ensure_topics(bootstrap, {"it.one": 1, "it.three": 3})
    ensure_topics(bootstrap, {"it.one": 1, "it.three": 3})  # idempotent
    assert _partitions(bootstrap, "it.one") == 1
    assert _partitions(bootstrap, "it.three") == 3


def test_down_stops_both(state: InfraState, settings: Settings) -> None:
    infra_down(settings)
    for part in (state.postgres, state.broker):
        assert part.pid is not None
        assert part.port is not None
        deadline = time.monotonic() + 60  # a bound for a broken run, not a measure
        while pid_alive(part.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(part.pid)
        assert not port_answers(part.port)
    after = infra_status(settings)
    assert not after.postgres.alive
    assert not after.broker.alive
    assert not EmbeddedPostgres.from_settings(settings).is_running()
    assert not EmbeddedBroker.from_settings(settings).is_running()
