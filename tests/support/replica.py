"""A streaming standby of an embedded PostgreSQL (issue 20), for the read-replica tests and
bench/bench_throughput.py --replicas: a replication role and pg_hba line on the primary,
``pg_basebackup -R`` (standby.signal and primary_conninfo), then the copy started on a port of
its own. As root everything runs as the primary's unprivileged user, in a directory of its own
under /var/tmp (services/core/infra/postgres.py explains why)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from services.core.infra.pgruntime import SHARED_TMP, private_dir
from services.core.infra.ports import free_port
from services.core.infra.postgres import ADMIN_USER, DB_USER, EmbeddedPostgres

REPLICATOR = "kgstream_replicator"
_HBA_LINE = f"host replication {REPLICATOR} 127.0.0.1/32 scram-sha-256\n"


def _dsn(port: int, user: str, password: str, dbname: str = "postgres") -> str:
    return (
        f"host=127.0.0.1 port={port} dbname={dbname} user={user} password={password}"
        " connect_timeout=10"
    )


def allow_replication(primary: EmbeddedPostgres, password: str) -> None:
    """The replication role and its pg_hba.conf line on ``primary`` (idempotent)."""
    assert primary.port is not None
    admin = _dsn(primary.port, ADMIN_USER, primary.password(ADMIN_USER))
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (REPLICATOR,)).fetchone()
        verb = sql.SQL("ALTER" if found else "CREATE")
        conn.execute(
            sql.SQL("{} ROLE {} WITH REPLICATION LOGIN PASSWORD {}").format(
                verb, sql.Identifier(REPLICATOR), sql.Literal(password)
            )
        )
        hba = primary.data_dir / "pg_hba.conf"
        if _HBA_LINE not in hba.read_text():
            with hba.open("a") as fh:  # appending keeps the file's owner (the server's user)
                fh.write(_HBA_LINE)
        conn.execute("SELECT pg_reload_conf()")


class Standby:
    """A hot standby of ``primary``, streaming from it; ``stop`` / ``kill`` / ``start``."""

    def __init__(self, primary: EmbeddedPostgres, embedded_user: str = "nobody") -> None:
        self.primary = primary
        self._user = pwd.getpwnam(embedded_user) if os.geteuid() == 0 else None
        base = private_dir(SHARED_TMP / f"kgstream-{os.geteuid()}")
        self.root = private_dir(base / f"standby-{uuid.uuid4().hex[:10]}")
        self.data_dir = self.root / "pgdata"
        self.socket_dir = self.root / "run"
        self.log_file = self.root / "standby.log"
        self.port = free_port()

    def url(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on the standby, as the service role (the primary's
        roles and passwords: the standby is a copy)."""
        password = self.primary.password(DB_USER)
        return f"postgresql+psycopg://{DB_USER}:{password}@127.0.0.1:{self.port}/{database}"

    def admin_dsn(self, database: str = "postgres") -> str:
        """libpq DSN of the standby as the superuser (pausing replay needs it)."""
        return _dsn(self.port, ADMIN_USER, self.primary.password(ADMIN_USER), database)

    def create(self) -> Standby:
        """Base backup of the primary into a new data directory, then start streaming."""
        assert self.primary.port is not None
        password = uuid.uuid4().hex
        allow_replication(self.primary, password)
        for path, mode in ((self.data_dir, 0o700), (self.socket_dir, 0o755)):
            path.mkdir(mode=mode)
            self._own(path)
            path.chmod(mode)
        self.log_file.touch()
        self._own(self.log_file)
        backup = self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", REPLICATOR,
            "-D", str(self.data_dir), "-R", "-X", "stream", "-c", "fast", "--no-sync",
            env={"PGPASSWORD": password},
        )  # fmt: skip
        if backup.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {backup.stdout}")
        conf = self.data_dir / "kgstream.conf"  # the primary's copy: its port and socket
        sockets = str(self.socket_dir).replace("'", "''")
        conf.write_text(
            "# a test standby (tests/support/replica.py)\n"
            "listen_addresses = '127.0.0.1'\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = '{sockets}'\n"
            # queries are not cancelled by the replay of what they still read
            "hot_standby_feedback = on\n"
        )
        self._own(conf)
        return self.start()

    def start(self, timeout_s: float = 60.0) -> Standby:
        """Start the standby and wait until it accepts connections. After a kill the old
        postmaster's backends may still hold its shared memory for a moment: starts are
        retried until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            started = self._run(
                "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data_dir),
                "-l", str(self.log_file),
            )  # fmt: skip
            if started.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"standby did not start: {started.stdout}\n{self.log()}")
            time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        """Shut it down (pg_ctl's ``mode``), if it runs."""
        if self.pid() is not None:
            self._run("pg_ctl", "stop", "-m", mode, "-w", "-t", "60", "-D", str(self.data_dir))

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends end when they notice) and wait until the port
        refuses connections."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not _alive(pid), 30, "the killed postmaster to be gone")
        wait_for(lambda: not self.accepts(), 30, "the killed standby to stop answering")

    def accepts(self) -> bool:
        """Whether the standby takes a connection now."""
        try:
            with psycopg.connect(self.admin_dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def pid(self) -> int | None:
        """The postmaster's pid while ``postmaster.pid`` exists."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def sync(self, timeout_s: float = 60.0) -> None:
        """Commit a transaction on the primary and wait until the standby has replayed it."""
        assert self.primary.port is not None
        admin = _dsn(self.primary.port, ADMIN_USER, self.primary.password(ADMIN_USER))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT txid_current()")  # a transaction id: a commit record to replay
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        target = row[0]

        def replayed() -> bool:
            found = self.execute(
                f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"  # an LSN we read
                " AND pg_last_xact_replay_timestamp() IS NOT NULL"
            )
            return bool(found[0][0])

        wait_for(replayed, timeout_s, f"the standby to replay up to {target}")

    def execute(self, statement: str, database: str = "postgres") -> list[tuple[Any, ...]]:
        """One statement as the superuser on the standby (``pg_wal_replay_pause()``...)."""
        with psycopg.connect(self.admin_dsn(database), autocommit=True) as conn:
            cur = conn.execute(statement)  # a constant of the caller's
            return cur.fetchall() if cur.description else []

    def remove(self) -> None:
        """Stop it (or what a kill left) and delete its files: no shutdown checkpoint, the
        files are going."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        """The end of the standby's log."""
        try:
            return self.log_file.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _own(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_", "LANG"))}
        base.update(LC_ALL="C", **(env or {}))
        extra: dict[str, Any] = {}
        if self._user is not None:
            base["HOME"] = str(self.root)
            extra = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        return subprocess.run(
            [str(self.primary.bin_dir / args[0]), *args[1:]], check=False, env=base, text=True,
            timeout=180, start_new_session=True, cwd=self.root, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **extra,
        )  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie no longer runs (its parent reaps it)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` every 20 ms until it holds; AssertionError naming ``what`` after
    ``timeout_s`` (a bound for a broken run, not a measure: conditions, not sleeps)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)
