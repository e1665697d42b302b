"""Run the `kgstream` CLI in a subprocess, pointed at one test's database and topics."""

from __future__ import annotations

import os
import subprocess
import sys

from services.core.settings import Settings


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
