from __future__ import annotations

from datetime import UTC, datetime

from services.core.contracts import DocumentEvent
from services.indexer.ordering import StoredDoc, content_hash, decide_delete, decide_upsert

T0 = datetime(2024, 1, 1, tzinfo=UTC)
T1 = datetime(2024, 1, 2, tzinfo=UTC)


def ev(
    kind: str = "upsert", version: int | None = None, at: datetime = T1, text: str = "x"
) -> DocumentEvent:
    return DocumentEvent(
        event_id="e", type=kind, doc_id="d", version=version, text=text, occurred_at=at
    )


def stored(
    version: int | None = None, at: datetime = T0, deleted: bool = False, text: str = "old"
) -> StoredDoc:
    return StoredDoc(version, content_hash("", text), at, deleted)


def test_first_upsert_applies() -> None:
    assert decide_upsert(None, ev(), content_hash("", "x")) == "apply"


def test_versions_decide_over_time() -> None:
    h = content_hash("", "x")
    assert decide_upsert(stored(version=5, at=T0), ev(version=4, at=T1), h) == "stale"
    assert decide_upsert(stored(version=5, at=T1), ev(version=6, at=T0), h) == "apply"
    assert decide_upsert(stored(version=5), ev(version=5), h) == "stale"


def test_same_content_is_unchanged() -> None:
    assert decide_upsert(stored(text="x"), ev(text="x"), content_hash("", "x")) == "unchanged"


def test_without_versions_time_orders() -> None:
    h = content_hash("", "x")
    assert decide_upsert(stored(at=T1), ev(at=T0), h) == "stale"
    assert decide_upsert(stored(at=T0), ev(at=T1), h) == "apply"


def test_tombstone_blocks_older_upserts() -> None:
    h = content_hash("", "x")
    assert decide_upsert(stored(version=3, deleted=True), ev(version=3), h) == "stale"
    assert decide_upsert(stored(version=3, deleted=True), ev(version=4), h) == "apply"
    assert decide_upsert(stored(at=T1, deleted=True), ev(at=T1), h) == "stale"


def test_delete_rules() -> None:
    assert decide_delete(None, ev("delete")) == "apply"
    assert decide_delete(stored(version=5), ev("delete", version=4)) == "stale"
    assert decide_delete(stored(version=5), ev("delete", version=5)) == "apply"
    assert decide_delete(stored(deleted=True), ev("delete")) == "unchanged"
