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
    moves_tenant,
)
from services.query_api.ingest import StoredDocument, delete_event, writable_by

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


def test_the_same_content_under_another_tenant_is_written_anew() -> None:
    """Entities are per tenant: a live document that changes tenant is resolved again in the
    new tenant's scope, whatever its content; a tombstone has nothing to move."""
    h = content_hash("", "x")
    mine = StoredDoc(None, h, T0, False, "t1")
    moved = ev(text="x").model_copy(update={"tenant": "t2"})
    assert moves_tenant(mine, moved)
    assert decide_upsert(mine, moved, h) == "apply"
    assert decide_upsert(mine, ev(text="x").model_copy(update={"tenant": "t1"}), h) == "unchanged"
    assert not moves_tenant(StoredDoc(None, h, T0, True, "t1"), moved)
    assert not moves_tenant(None, moved)
    later = StoredDoc(None, h, T1 + timedelta(days=1), False, "t1")
    assert decide_upsert(later, moved, h) == "stale"  # an older event moves nothing


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


# Review of issue 18 (findings 5 and 6): an HTTP DELETE means "gone as of now". It carries no
# version and applies to whatever is stored when it arrives (everything stored was published
# before it on its partition); its tombstone keeps the greatest version and time seen, so only
# what is published after it re-creates the document.
def test_a_delete_without_a_version_wins_over_a_higher_stored_version() -> None:
    """Failed on the first fix: the API copied the stored version (5) into the delete, and an
    upsert v6 published before it but applied after the API read the row made it stale."""
    assert decide_delete(stored(version=6, at=T0), ev("delete", at=T1)) == "apply"
    assert decide_delete(stored(version=6, at=T1), ev("delete", at=T0)) == "apply"


def test_a_delete_without_a_version_wins_over_a_stored_clock_ahead() -> None:
    """An upsert published before the delete with a clock ahead within the skew."""
    ahead = T1 + SKEW - timedelta(seconds=1)
    assert decide_delete(stored(at=ahead), ev("delete", at=T1)) == "apply"


def test_a_versioned_delete_still_loses_to_a_newer_version() -> None:
    """Kafka publishers' version ordering is unchanged: a delete of v4 does not remove v5."""
    assert decide_delete(stored(version=5, at=T0), ev("delete", version=4, at=T1)) == "stale"
    assert decide_delete(stored(at=T1), ev("delete", version=4, at=T0)) == "stale"


def test_a_tombstone_of_a_versionless_delete_keeps_versions_deciding() -> None:
    """The tombstone keeps the stored version (documents.write_document): a versioned upsert
    re-creates the document with a higher version only, whatever its time; an upsert without
    a version needs a time after the tombstone's."""
    h = content_hash("", "x")
    tomb = stored(version=6, at=T1, deleted=True)
    assert decide_upsert(tomb, ev(version=6, at=T1 + SKEW), h) == "stale"
    assert decide_upsert(tomb, ev(version=7, at=T0), h) == "apply"
    assert decide_upsert(tomb, ev(at=T0), h) == "stale"
    assert decide_upsert(tomb, ev(at=T1 + timedelta(seconds=1)), h) == "apply"


def test_the_http_delete_event_carries_no_version() -> None:
    """Failed on the first fix: it carried the stored version, so it lost to a higher one."""
    ahead = T0 + timedelta(seconds=60)  # a stored clock ahead within the skew: kept
    row = StoredDocument("t1", 5, ahead, deleted=False)
    event = delete_event("d", stored=row, tenant="t1", now=T0)
    assert "version" not in event
    assert (event["occurred_at"], event["tenant"]) == (ahead.isoformat(), "t1")
    later = T1 + timedelta(hours=1)
    assert delete_event("d", stored=row, now=later)["occurred_at"] == later.isoformat()


def test_who_may_write_an_id() -> None:
    """Nobody stored it, the tenant's (live or tombstone), or a tombstone left without a
    tenant (before tombstones kept one); never another tenant's, nor a live tenantless one."""
    assert writable_by(None, "t1")
    assert writable_by(StoredDocument("t1", None, T0, deleted=False), "t1")
    assert writable_by(StoredDocument("t1", None, T0, deleted=True), "t1")
    assert writable_by(StoredDocument(None, None, T0, deleted=True), "t1")
    assert not writable_by(StoredDocument("t2", None, T0, deleted=True), "t1")
    assert not writable_by(StoredDocument("t2", None, T0, deleted=False), "t1")
    assert not writable_by(StoredDocument(None, None, T0, deleted=False), "t1")
