"""The log formats and the log context (services/core/logs.py, services/core/log_context.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from services.core import log_context
from services.core.logs import ContextFilter, JsonFormatter, TextFormatter, setup_logging


def _record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("kgstream.test", logging.WARNING, __file__, 1, message, args, info)


def _raise(exc: BaseException) -> None:
    raise exc


def _raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback."""
    try:
        _raise(exc)
    except BaseException as caught:  # noqa: BLE001 - any exception will do
        return caught
    raise AssertionError("not raised")


def _filtered(record: logging.LogRecord, process: str = "indexer") -> logging.LogRecord:
    assert ContextFilter(process).filter(record)
    return record


def test_json_line_has_the_fields_and_the_bound_context() -> None:
    with log_context.bound(event_id="e-1", doc_id="d-1"):
        record = _filtered(_record("applied %s", "upsert"))
    line = JsonFormatter().format(record)
    data = json.loads(line)
    assert data["level"] == "WARNING"
    assert data["logger"] == "kgstream.test"
    assert data["message"] == "applied upsert"
    assert data["process"] == "indexer"
    assert data["event_id"] == "e-1"
    assert data["doc_id"] == "d-1"
    assert "snapshot_id" not in data
    assert data["ts"].endswith("+00:00")
    assert "exc_info" not in data


def test_json_exception_is_a_string_and_the_record_one_line() -> None:
    exc = _raised(ValueError("bad\nvalue \u2028 here"))
    record = _filtered(_record("line one\nline two", exc=exc))
    line = JsonFormatter().format(record)
    assert line.splitlines() == [line]  # newlines and U+2028 are escaped
    data = json.loads(line)
    assert data["message"] == "line one\nline two"
    assert data["exc_info"].startswith("Traceback (most recent call last)")
    assert "ValueError: bad" in data["exc_info"]


def test_text_line_appends_the_context_before_the_traceback() -> None:
    exc = _raised(RuntimeError("boom"))
    with log_context.bound(snapshot_id=7):
        record = _filtered(_record("recompute failed", exc=exc), "communities")
    first, *rest = TextFormatter().format(record).splitlines()
    assert first.endswith("WARNING kgstream.test: recompute failed [snapshot_id=7]")
    assert rest[0].startswith("Traceback")


def test_context_is_restored_after_the_block_and_nests() -> None:
    with log_context.bound(event_id="outer", doc_id="d"):
        with log_context.bound(event_id="inner"):
            assert log_context.current() == {"event_id": "inner", "doc_id": "d"}
        assert log_context.current() == {"event_id": "outer", "doc_id": "d"}
    assert log_context.current() == {}


def test_context_is_restored_when_the_block_raises() -> None:
    with pytest.raises(KeyError), log_context.bound(event_id="e"):
        raise KeyError("x")
    assert log_context.current() == {}


def test_unknown_context_field_is_refused() -> None:
    with pytest.raises(ValueError, match="tenant"), log_context.bound(tenant="t"):
        pass


def test_concurrent_tasks_do_not_see_each_others_context() -> None:
    seen: dict[str, dict[str, str | int]] = {}

    async def handle(event_id: str, pause: asyncio.Event, go: asyncio.Event) -> None:
        with log_context.bound(event_id=event_id):
            pause.set()
            await go.wait()
            seen[event_id] = log_context.current()

    async def main() -> None:
        a_in, b_in, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(handle("a", a_in, go)),
            asyncio.create_task(handle("b", b_in, go)),
        ]
        await a_in.wait()
        await b_in.wait()  # both blocks are open at once
        go.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert seen == {"a": {"event_id": "a"}, "b": {"event_id": "b"}}


@pytest.fixture
def root_handlers() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def test_setup_routes_library_loggers_through_one_json_handler(
    root_handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    setup_logging("INFO", "text", "query-api")
    setup_logging("INFO", "json", "query-api")  # a second setup replaces the first handler
    with log_context.bound(snapshot_id=3):
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)
    logging.getLogger("kafka.conn").info("quieted below WARNING")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["logger"] == "uvicorn.error"
    assert data["process"] == "query-api"
    assert data["snapshot_id"] == 3
