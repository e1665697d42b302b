"""The one logging setup every kgstream process uses (called by the CLI before any command).

``text`` (the default) is one human line per record; ``json`` is one JSON object per line with
``ts``, ``level``, ``logger``, ``message``, ``process`` (indexer, communities, query-api or
cli), ``pid``, the bound context (``event_id``, ``doc_id``, ``snapshot_id``: see
services/core/log_context.py) and ``exc_info`` as a string when there is one. Everything goes
through one handler on the root logger: faust and uvicorn are started without logging setups
of their own (services/indexer/app.py, services/cli/main.py), so their records are formatted
here too."""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Literal

from services.core import log_context

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Libraries that say too much at INFO. kafka-python times its own poll tasks and warns past
# 0.1 s, which a loaded 2-core machine reaches at start-up: not a fault of ours or the broker's.
QUIETER = {
    "httpx": logging.WARNING,
    "kafka": logging.WARNING,
    "aiokafka": logging.WARNING,
    "kafka.net.selector": logging.ERROR,
    # INFO is one line per tick; WARNING says a tick was skipped while a recompute still runs,
    # which max_instances=1 asks for (services/communities/app.py).
    "apscheduler": logging.ERROR,
}


class ContextFilter(logging.Filter):
    """Adds the process name and the bound log context to every record it sees."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.kgstream_process = self.process
        for name, value in log_context.current().items():
            setattr(record, name, value)
        return True


def _context(record: logging.LogRecord) -> dict[str, object]:
    values = {name: getattr(record, name, None) for name in log_context.FIELDS}
    return {name: value for name, value in values.items() if value is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": getattr(record, "kgstream_process", None),
            "pid": record.process,
            **_context(record),
        }
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)  # ASCII only: no line separator inside a line


class TextFormatter(logging.Formatter):
    """The human format, with the bound context appended (``event_id=... doc_id=...``)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        context = _context(record)
        if not context:
            return line
        return line + " [" + " ".join(f"{k}={v}" for k, v in context.items()) + "]"


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours: a second setup replaces it instead of adding another."""


# Loggers of libraries that may configure themselves; they must reach the root handler.
_LIBRARY_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "faust", "mode", "alembic")


def setup_logging(level: str, fmt: LogFormat, process: str) -> None:
    """Route every logger through one stderr handler in ``fmt``; idempotent."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter(process))
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _LIBRARY_LOGGERS:
        # A library that configured logging before us (uvicorn's default dictConfig, say)
        # leaves its own handlers, levels, propagate=False or disabled loggers: undo that.
        lib = logging.getLogger(name)
        lib.handlers.clear()
        lib.propagate, lib.disabled = True, False
        lib.setLevel(logging.NOTSET)  # QUIETER below sets the few that log too much
    for name, quieter in QUIETER.items():
        logging.getLogger(name).setLevel(quieter)
    logging.captureWarnings(True)  # warnings.warn output is a log record too
    if fmt == "json":
        threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """An exception no thread caught, as one record (one JSON line) instead of stderr text."""
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    thread = args.thread.name if args.thread else "?"
    info = (args.exc_type, args.exc_value, args.exc_traceback)
    logging.getLogger("kgstream").critical("uncaught exception in thread %s", thread, exc_info=info)
