"""A query API process on a kept eval database, for the benchmarks that load it
(bench_readyz.py, bench_throughput.py): the kept embedded PostgreSQL started, one
`kgstream worker query-api` on a free port (offline models, no broker), ready when /readyz is."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from tests.support.replica import Standby  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def kept_query_api(
    keep: Path, *, code: Path = ROOT, env: Mapping[str, str] | None = None, replicas: int = 0
) -> Iterator[str]:
    """The base URL of a ready query API on the database kept in ``keep`` (a `kgstream eval
    --keep` home), run from the source tree ``code`` with ``env`` added; stopped afterwards.
    ``replicas``: that many streaming standbys of it (tests/support/replica.py) are made, and
    every query read goes to them (KGSTREAM_READ_FALLBACK=unavailable: none to the primary)."""
    pg = EmbeddedPostgres(keep)
    url = pg.start()
    with contextlib.ExitStack() as standbys:
        read_env = {}
        if replicas:
            made = [Standby(pg).create() for _ in range(replicas)]
            for standby in made:
                standbys.callback(standby.remove)
            database = url.rsplit("/", 1)[1]
            read_env = {
                "KGSTREAM_DATABASE_READ_URL": ",".join(s.url(database) for s in made),
                "KGSTREAM_READ_FALLBACK": "unavailable",
            }
        with _api(pg, url, code, {**read_env, **(env or {})}) as base:
            yield base


@contextlib.contextmanager
def _api(pg: EmbeddedPostgres, url: str, code: Path, env: Mapping[str, str]) -> Iterator[str]:
    port = free_port()
    full = {
        **os.environ,
        "KGSTREAM_DATABASE_URL": url,
        "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # no broker needed
        "KGSTREAM_API_PORT": str(port),
        "KGSTREAM_LOG_LEVEL": "WARNING",
        **env,
    }
    api = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "worker", "query-api"], env=full, cwd=code
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or api.poll() is not None:
                raise SystemExit("the query API did not become ready")
            time.sleep(0.5)
        yield base
    finally:
        api.terminate()
        api.wait(30)
        pg.stop()
