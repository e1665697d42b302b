"""``kgstream infra up|down|status``: start, find and stop the embedded servers of one home."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from services.core.infra.broker import EmbeddedBroker
from services.core.infra.errors import InfraError
from services.core.infra.ports import pid_alive, port_answers, split_host_port
from services.core.infra.postgres import EmbeddedPostgres
from services.core.infra.topics import ensure_topics
from services.core.settings import Settings

STATE_FILE = "infra.json"


@dataclass(frozen=True)
class ComponentState:
    """One server: configured (``managed=False``) or started by kgstream (``managed=True``)."""

    name: str
    managed: bool
    endpoint: str | None
    alive: bool
    pid: int | None = None
    port: int | None = None
    data_dir: str | None = None
    log_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; passwords in URLs are masked."""
        return {**asdict(self), "endpoint": _mask(self.endpoint)}


@dataclass(frozen=True)
class InfraState:
    """What runs where for one kgstream home."""

    home: str
    state_file: str
    postgres: ComponentState
    broker: ComponentState

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict for ``kgstream infra status --json``."""
        return {
            "home": self.home,
            "state_file": self.state_file,
            "postgres": self.postgres.to_dict(),
            "broker": self.broker.to_dict(),
        }


@dataclass(frozen=True)
class Endpoints:
    """Where the services connect."""

    database_url: str
    kafka_bootstrap_servers: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; the database password is masked."""
        return {
            "database_url": _mask(self.database_url),
            "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
        }


def _mask(url: str | None) -> str | None:
    if url is None or "://" not in url:
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def default_topics(settings: Settings) -> dict[str, int]:
    """Topics kgstream needs, with partition counts (snapshots stay ordered: 1 partition)."""
    return {
        settings.documents_topic: settings.topic_partitions,
        settings.dlq_topic: settings.topic_partitions,
        settings.snapshots_topic: 1,
    }


def _state_path(settings: Settings) -> Path:
    return settings.home_dir / STATE_FILE


def _read_state(settings: Settings) -> dict[str, Any]:
    try:
        data = json.loads(_state_path(settings).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(settings: Settings, data: dict[str, Any]) -> None:
    path = _state_path(settings)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    # The embedded database URL carries its password: readable by this user alone.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _locked(settings: Settings) -> Iterator[None]:
    # Two `infra up` at once would each start a server on the same data directory.
    settings.home_dir.mkdir(parents=True, exist_ok=True)
    with (settings.home_dir / "infra.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _entry_alive(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    pid, port = entry.get("pid"), entry.get("port")
    return isinstance(pid, int) and isinstance(port, int) and pid_alive(pid) and port_answers(port)


def _embedded(name: str, entry: Any) -> ComponentState:
    if not isinstance(entry, dict):
        return ComponentState(name=name, managed=True, endpoint=None, alive=False)
    return ComponentState(
        name=name,
        managed=True,
        endpoint=entry.get("endpoint"),
        alive=_entry_alive(entry),
        pid=entry.get("pid"),
        port=entry.get("port"),
        data_dir=entry.get("data_dir"),
        log_file=entry.get("log_file"),
    )


def _configured(name: str, endpoint: str) -> ComponentState:
    try:
        if name == "postgres":
            url = make_url(endpoint)
            host, port = url.host or "127.0.0.1", url.port or 5432
        else:
            host, port = split_host_port(endpoint.split(",", maxsplit=1)[0])
        alive = port_answers(port, host, timeout=1.0)
    except (ArgumentError, ValueError):
        alive = False
    return ComponentState(name=name, managed=False, endpoint=endpoint, alive=alive)


def _start_postgres(settings: Settings, entry: Any) -> dict[str, Any]:
    if _entry_alive(entry):
        return dict(entry)
    pg = EmbeddedPostgres.from_settings(settings)
    url = pg.start()
    return {
        "endpoint": url,
        "pid": pg.pid(),
        "port": pg.port,
        "data_dir": str(pg.data_dir),
        "log_file": str(pg.log_file),
    }


def _start_broker(settings: Settings, entry: Any) -> dict[str, Any]:
    if _entry_alive(entry):
        return dict(entry)
    broker = EmbeddedBroker.from_settings(settings)
    bootstrap = broker.start()
    return {
        "endpoint": bootstrap,
        "pid": broker.pid,
        "port": broker.port,
        "log_file": str(broker.log_file),
    }


def infra_up(settings: Settings, *, create_topics: bool = True) -> InfraState:
    """Start the embedded servers that are not configured (reusing live ones), record them.

    With ``create_topics``, kgstream's topics are created on whichever broker is in use.
    """
    with _locked(settings):
        state = _read_state(settings)
        if settings.database_url is None:
            state["postgres"] = _start_postgres(settings, state.get("postgres"))
            _write_state(settings, state)
        if settings.kafka_bootstrap_servers is None:
            state["broker"] = _start_broker(settings, state.get("broker"))
            _write_state(settings, state)
    if create_topics:
        from services.core.producer import topic_max_message_bytes  # noqa: PLC0415 (kafka: slow)

        ensure_topics(
            resolve_endpoints(settings).kafka_bootstrap_servers,
            default_topics(settings),
            max_message_bytes=topic_max_message_bytes(settings),
        )
    return infra_status(settings)


def infra_down(settings: Settings) -> InfraState:
    """Stop the embedded servers of this home: those recorded, and any not configured."""
    with _locked(settings):
        state = _read_state(settings)
        errors: list[str] = []
        if "postgres" in state or settings.database_url is None:
            try:
                EmbeddedPostgres.from_settings(settings).stop()
                state.pop("postgres", None)
            except InfraError as exc:
                errors.append(str(exc))
        if "broker" in state or settings.kafka_bootstrap_servers is None:
            EmbeddedBroker.from_settings(settings).stop()
            state.pop("broker", None)
        if state:
            _write_state(settings, state)
        else:
            _state_path(settings).unlink(missing_ok=True)
    if errors:
        raise InfraError("; ".join(errors))
    return infra_status(settings)


def infra_status(settings: Settings) -> InfraState:
    """What runs where: configured endpoints, or the embedded servers from the state file."""
    state = _read_state(settings)
    postgres = (
        _configured("postgres", settings.database_url)
        if settings.database_url
        else _embedded("postgres", state.get("postgres"))
    )
    broker = (
        _configured("broker", settings.kafka_bootstrap_servers)
        if settings.kafka_bootstrap_servers
        else _embedded("broker", state.get("broker"))
    )
    return InfraState(
        home=str(settings.home_dir),
        state_file=str(_state_path(settings)),
        postgres=postgres,
        broker=broker,
    )


def resolve_endpoints(settings: Settings) -> Endpoints:
    """Configured URLs first, else those of live embedded servers; never starts anything."""
    state = _read_state(settings)
    found: dict[str, str] = {}
    for key, configured in (
        ("postgres", settings.database_url),
        ("broker", settings.kafka_bootstrap_servers),
    ):
        if configured:
            found[key] = configured
        elif _entry_alive(state.get(key)):
            found[key] = str(state[key]["endpoint"])
        else:
            what = (
                "KGSTREAM_DATABASE_URL" if key == "postgres" else "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS"
            )
            raise InfraError(
                f"no {key} is running for home {settings.home_dir}: run "
                f"`kgstream infra up` (or set {what})"
            )
    return Endpoints(database_url=found["postgres"], kafka_bootstrap_servers=found["broker"])
