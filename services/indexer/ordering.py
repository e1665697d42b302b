"""Which events apply: versions first, content hash and time when versions are absent.
Pure functions, so the rules can be read and tested in one place.

Times are bounded (``bounded_time`` in services/core/clocks.py): an ``occurred_at`` more than
the allowed clock skew ahead of its reference (an event's record time, a stored row's write
time) comes from a broken clock and orders at the reference instead, so no clock can put a
document out of reach of later updates and deletes (docs/ingest.md, "Ordering and clocks")."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from services.core.clocks import bounded_time
from services.core.contracts import DocumentEvent

Decision = Literal["apply", "stale", "unchanged"]


@dataclass(frozen=True)
class StoredDoc:
    """What the documents row says about a doc (a deleted doc keeps a tombstone row)."""

    version: int | None
    content_hash: str | None
    occurred_at: datetime
    deleted: bool
    tenant: str | None = None
    acl: tuple[str, ...] | None = None


def moves_access(stored: StoredDoc | None, event: DocumentEvent) -> bool:
    """Does the upsert change who can see a live document's chunks (its tenant or ACL)? The
    held graphs of the query processes re-read their classes (graph_store/changes.py
    ``log_access``)."""
    if stored is None or stored.deleted:
        return False
    acl = None if event.acl is None else tuple(event.acl)
    return stored.tenant != event.tenant or stored.acl != acl


def reference_time(record_timestamp: float | None, now: float) -> datetime:
    """An event's reference for ``bounded_time``: its record's timestamp (seconds since the
    epoch, set by the producer or the broker), never later than ``now`` (the indexer's own
    clock, so a producer's clock cannot move it forward); ``now`` when the record has none."""
    seconds = now if record_timestamp is None or record_timestamp <= 0 else record_timestamp
    return datetime.fromtimestamp(min(seconds, now), UTC)


def as_ordered(event: DocumentEvent, reference: datetime, max_skew: timedelta) -> DocumentEvent:
    """The event with its ``occurred_at`` bounded against ``reference`` (``bounded_time``):
    the time the indexer orders, stores and measures it by."""
    at = bounded_time(event.occurred_at, reference, max_skew)
    return event if at == event.occurred_at else event.model_copy(update={"occurred_at": at})


def content_hash(title: str, text: str) -> str:
    """The document's identity when no version is given."""
    return hashlib.sha256(f"{title}\x1f{text}".encode()).hexdigest()


def _older(stored: StoredDoc, event: DocumentEvent) -> bool:
    """Is the event not newer than what is stored? Versions decide when both sides have one."""
    if stored.version is not None and event.version is not None:
        return event.version < stored.version
    return event.occurred_at < stored.occurred_at


def moves_tenant(stored: StoredDoc | None, event: DocumentEvent) -> bool:
    """Does the upsert give a live document another tenant? Its entities are its tenant's
    (services/indexer/scope.py), so the document is then written anew in the new tenant's
    scope, every chunk resolved again, whatever its content."""
    return stored is not None and not stored.deleted and stored.tenant != event.tenant


def decide_upsert(  # noqa: PLR0911 - one return per rule reads best
    stored: StoredDoc | None, event: DocumentEvent, doc_hash: str
) -> Decision:
    """An upsert applies unless it is older than what is stored or changes nothing."""
    if stored is None:
        return "apply"
    if stored.deleted:
        # A tombstone wins against anything not strictly newer: no resurrection by replays.
        if stored.version is not None and event.version is not None:
            return "apply" if event.version > stored.version else "stale"
        return "apply" if event.occurred_at > stored.occurred_at else "stale"
    if _older(stored, event):
        return "stale"
    if stored.content_hash == doc_hash:
        return "apply" if moves_tenant(stored, event) else "unchanged"
    if stored.version is not None and event.version is not None and event.version == stored.version:
        # Same version, different content: the producer broke monotonicity; first one wins.
        return "stale"
    return "apply"


def decide_delete(stored: StoredDoc | None, event: DocumentEvent) -> Decision:
    """A delete with a version applies unless a newer version (or, without versions on both
    sides, a newer time) is stored. A delete without a version (what DELETE /v1/documents
    sends) means "gone as of its publication" and applies to whatever is stored: events of a
    doc_id share a partition and are applied in offset order, so everything stored was
    published before it, a higher version or a time ahead of its clock included."""
    if stored is None:
        return "apply"  # leaves a tombstone so an older upsert arriving later stays dead
    if stored.deleted:
        return "unchanged"
    if event.version is None:
        return "apply"
    return "stale" if _older(stored, event) else "apply"
