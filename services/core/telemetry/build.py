"""``kgstream_build_info``: what is running (version, commit, process)."""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

from prometheus_client import Gauge

BUILD_INFO = Gauge(
    "kgstream_build_info", "What is running (always 1)", ["version", "commit", "process"]
)
_SOURCE = Path(__file__).resolve().parents[3]


def version() -> str:
    """The installed kgstream package's version."""
    try:
        return metadata.version("kgstream")
    except metadata.PackageNotFoundError:
        return "unknown"


def commit(source: Path = _SOURCE) -> str:
    """``git rev-parse HEAD`` of the source tree when it is a checkout, else
    KGSTREAM_BUILD_COMMIT (set by image builds), else "unknown"."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        found = None
    if found is not None and found.returncode == 0 and found.stdout.strip():
        return found.stdout.strip()
    return os.environ.get("KGSTREAM_BUILD_COMMIT") or "unknown"


def record_build(process: str) -> None:
    """Set this process's build info series."""
    BUILD_INFO.labels(version=version(), commit=commit(), process=process).set(1)
