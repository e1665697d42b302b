"""Plumbing for fault tests: servers of a test's own (stopping one never disturbs the session's
shared PostgreSQL and broker), other kgstream processes (communities worker, query API) and
the waiting and checking around them."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

import psycopg

from services.communities.lock import libpq_url
from services.core.db import migrations
from services.core.embedding import Embedder
from services.core.extraction import Extractor
from services.core.infra.broker import EmbeddedBroker
from services.core.infra.postgres import DB_NAME, EmbeddedPostgres
from services.core.infra.topics import ensure_topics
from services.core.settings import Settings
from tests.support.cli import env_for
from tests.support.graph import clean_build, create_database, scalar
from tests.support.workers import ROOT, Worker, sample_lines


def wait_until(check: Callable[[], bool], timeout: float, poll: float = 0.2) -> bool:
    """Poll ``check`` until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


_PRISTINE: list[EmbeddedPostgres] = []  # one initialised, migrated, stopped cluster per process


def _pristine() -> EmbeddedPostgres:
    """A cluster made once per test process (initdb, passwords, migrations), then stopped: the
    source every ``own_postgres`` copies. Purged when the process exits."""
    if not _PRISTINE:
        pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="kgstream-pristine-")))
        migrations.upgrade(pg.start(), 384)
        pg.stop()
        atexit.register(shutil.rmtree, pg.home, ignore_errors=True)
        atexit.register(pg.purge)
        _PRISTINE.append(pg)
    return _PRISTINE[0]


@contextmanager
def own_postgres(home: Path) -> Iterator[EmbeddedPostgres]:
    """An embedded PostgreSQL of the test's own, its ``kgstream`` database migrated; purged
    at the end. A copy of the process's pristine cluster (its data directory with owners and
    modes, and its passwords): initdb and the migrations run once per process, not per test."""
    source = _pristine()
    pg = EmbeddedPostgres(home)
    try:
        pg.data_dir.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(source.data_dir), str(pg.data_dir)], check=True)
        (home / "secrets").parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["cp", "-a", str(source.home / "secrets"), str(home / "secrets")], check=True
        )
        pg.start()
        yield pg
    finally:
        pg.purge()


@contextmanager
def own_broker(home: Path, settings: Settings) -> Iterator[EmbeddedBroker]:
    """A tansu broker of the test's own with the topics of ``settings``; stopped at the end."""
    broker = EmbeddedBroker(home)
    try:
        create_topics(broker.start(), settings)
        yield broker
    finally:
        broker.stop()


def create_topics(bootstrap: str, settings: Settings) -> None:
    """The topics a fresh broker needs, as the session fixture creates them."""
    ensure_topics(
        bootstrap, {settings.documents_topic: 2, settings.dlq_topic: 1, settings.snapshots_topic: 1}
    )


def unprocessed(url: str, lines: Sequence[str]) -> list[str]:
    """The lines whose event_id is not in processed_events (what a lost broker took along)."""
    done = set(scalar(url, "SELECT coalesce(array_agg(event_id), '{}') FROM processed_events"))
    return [line for line in lines if str(json.loads(line)["event_id"]) not in done]


def start_process(
    settings: Settings, log: Path, *args: str, env: dict[str, str] | None = None
) -> Worker:
    """`kgstream ARGS...` in the background, in a session of its own (so ``kill_group`` can
    reap whatever it spawned), output in ``log``."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", *args],
            env={**env_for(settings), "KGSTREAM_LOG_LEVEL": "INFO", **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    return Worker(proc, log, settings.consumer_group)


def group_members(worker: Worker) -> list[int]:
    """Pids still alive in the process group the worker leads (itself included)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == worker.pid and fields[0] != "Z":  # pgrp, not a zombie
            pids.append(int(stat.parent.name))
    return pids


def kill_group(worker: Worker) -> None:
    """SIGKILL every process left in the worker's group (test clean-up)."""
    worker.kill()
    for pid in group_members(worker):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def moved(settings: Settings, **changes: object) -> Settings:
    """``settings`` pointed elsewhere (``database_url=``, ``kafka_bootstrap_servers=``)."""
    return settings.model_copy(update=changes)


_SAMPLE_TEMPLATES: dict[str, str] = {}  # server -> a database holding the indexed sample


def indexed_sample(
    settings: Settings, *, embedder: Embedder, extractor: Extractor, executor: Executor
) -> str:
    """A fresh database holding the 48 sample documents, indexed in process (built once per
    session on the server of ``settings.database_url``, then cloned: ~0.2 s)."""
    url = str(settings.database_url)
    server = url.rsplit("/", 1)[0]
    if server not in _SAMPLE_TEMPLATES:
        template = create_database(url)
        clean_build(
            template,
            sample_lines(),
            embedder=embedder,
            extractor=extractor,
            executor=executor,
            settings=settings,
        )
        _SAMPLE_TEMPLATES[server] = template.rsplit("/", 1)[1]
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = libpq_url(server) + "/" + DB_NAME
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{_SAMPLE_TEMPLATES[server]}"')
    return f"{server}/{name}"


def add_fault_trigger(database_url: str, name: str, when: str, body: str) -> None:
    """A row trigger ``name`` that runs the PL/pgSQL ``body`` (ending in ``RETURN NEW;``)
    ``when`` (e.g. "BEFORE INSERT ON chunks"), with a sequence ``{name}_seq`` for bodies that
    count: faults injected in the database, where they happen in production."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(f"CREATE SEQUENCE {name}_seq")
        conn.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} END $$"
        )
        conn.execute(f"CREATE TRIGGER {name} {when} FOR EACH ROW EXECUTE FUNCTION {name}()")


def hold_chunk_inserts(settings: Settings, doc_id: str) -> None:
    """Every chunk insert of ``doc_id`` fails as a serialization failure (transient) until
    ``release_chunk_inserts``."""
    with psycopg.connect(libpq_url(str(settings.database_url)), autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.doc_id = '{doc_id}' THEN"
            "  RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';"
            " END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER hold BEFORE INSERT ON chunks FOR EACH ROW EXECUTE FUNCTION hold()"
        )


def release_chunk_inserts(settings: Settings) -> None:
    """Undo ``hold_chunk_inserts``."""
    with psycopg.connect(libpq_url(str(settings.database_url)), autocommit=True) as conn:
        conn.execute("DROP TRIGGER hold ON chunks")
        conn.execute("DROP FUNCTION hold()")


class _Server(Protocol):
    def pid(self) -> int | None: ...


def postgres_pids(pg: _Server, *, backends: bool = True) -> list[int]:
    """The postmaster, and with ``backends`` every process it started."""
    postmaster = pg.pid()
    assert postmaster is not None
    pids = [postmaster]
    if backends:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with suppress(OSError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:  # ppid
                    pids.append(int(stat.parent.name))
    return pids


@contextmanager
def frozen(pids: Sequence[int]) -> Iterator[None]:
    """SIGSTOP ``pids`` for the block, SIGCONT after it: a PostgreSQL frozen this way accepts
    TCP connections and never answers, the worst case for a client without timeouts. A process
    that ended since ``pids`` was read (a backend whose client left) needs no freezing; the
    ones already stopped are continued whatever happens (a postmaster left stopped cannot be
    shut down: the chaos test's teardown failed so once, stop 36)."""
    try:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
