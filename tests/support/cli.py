"""Run the `kgstream` CLI in a subprocess, pointed at one test's database and topics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from services.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def user_env(home: Path, **settings: str) -> dict[str, str]:
    """A user's environment on the embedded default: no KGSTREAM_* but ``home``, log level
    WARNING and the given settings (``log_format="json"`` is KGSTREAM_LOG_FORMAT=json); this
    checkout's code first on the path, whatever the virtualenv has installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGSTREAM_")}
    env["PYTHONPATH"] = str(ROOT)
    env["KGSTREAM_HOME"] = str(home)
    env["KGSTREAM_LOG_LEVEL"] = "WARNING"
    env.update({f"KGSTREAM_{name.upper()}": value for name, value in settings.items()})
    return env


def env_for(settings: Settings) -> dict[str, str]:
    """The process environment that makes the CLI use these settings."""
    return {
        **os.environ,
        "KGSTREAM_HOME": str(settings.home),
        "KGSTREAM_DATABASE_URL": str(settings.database_url),
        "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS": str(settings.kafka_bootstrap_servers),
        "KGSTREAM_DOCUMENTS_TOPIC": settings.documents_topic,
        "KGSTREAM_DLQ_TOPIC": settings.dlq_topic,
        "KGSTREAM_SNAPSHOTS_TOPIC": settings.snapshots_topic,
        "KGSTREAM_CONSUMER_GROUP": settings.consumer_group,
        "KGSTREAM_MAX_DOCUMENT_BYTES": str(settings.max_document_bytes),
        "KGSTREAM_INDEXER_STALL_AFTER_S": str(settings.indexer_stall_after_s),
        "KGSTREAM_LOG_LEVEL": "WARNING",
        # Tests run several workers on one host: each takes any free metrics port.
        "KGSTREAM_INDEXER_METRICS_PORT": "0",
        "KGSTREAM_COMMUNITIES_METRICS_PORT": "0",
    }


def kgstream(
    settings: Settings, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`kgstream ARGS...` to completion, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env=env_for(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
