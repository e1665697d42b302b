from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.core.clocks import bounded_time
from services.core.contracts import DocumentEvent
from services.indexer.ordering import (
    StoredDoc,
    as_ordered,
    content_hash,
    decide_delete,
    decide_upsert,
)

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


# Issue 18, finding 5: an occurred_at far in the future froze the document (every later update
# and delete without a version was stale). The time an event is ordered by is bounded by its
# record's time plus KGSTREAM_MAX_CLOCK_SKEW_S.
SKEW = timedelta(seconds=300)
FAR = datetime(2099, 1, 1, tzinfo=UTC)


def test_an_occurred_at_within_the_skew_is_trusted() -> None:
    assert bounded_time(T1 + SKEW, T1, SKEW) == T1 + SKEW
    assert bounded_time(T0, T1, SKEW) == T0  # the past is the publisher's to state


def test_an_occurred_at_beyond_the_skew_is_ordered_at_its_reference() -> None:
    assert bounded_time(T1 + SKEW + timedelta(seconds=1), T1, SKEW) == T1
    assert bounded_time(datetime(9999, 12, 31, tzinfo=UTC), T1, SKEW) == T1
    assert as_ordered(ev(at=FAR), T1, SKEW).occurred_at == T1


def test_a_clock_far_ahead_cannot_freeze_a_document() -> None:
    h = content_hash("", "y")
    bad = as_ordered(ev(at=FAR, text="x"), T0, SKEW)
    after_bad = stored(at=bad.occurred_at, text="x")
    update = as_ordered(ev(at=T0 + timedelta(seconds=10), text="y"), T0, SKEW)
    assert decide_upsert(after_bad, update, h) == "apply"
    delete = as_ordered(ev("delete", at=T0 + timedelta(seconds=20)), T0, SKEW)
    assert decide_delete(after_bad, delete) == "apply"


def test_a_row_stored_before_the_bound_is_ordered_by_when_it_was_written() -> None:
    """A documents row written with a far-future occurred_at before the bound existed: its
    time is bounded against the row's own write time, so it does not stay frozen either."""
    legacy = stored(at=bounded_time(FAR, T0, SKEW))
    assert decide_delete(legacy, ev("delete", at=T1)) == "apply"
    assert decide_upsert(legacy, ev(at=T1), content_hash("", "x")) == "apply"
