"""Errors raised by the embedded infrastructure."""

from __future__ import annotations

from pathlib import Path

from services.core.errors import KgstreamError


class InfraError(KgstreamError):
    """An embedded server could not be started, stopped or reached."""


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
