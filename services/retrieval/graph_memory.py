"""The graph local mode walks, held in memory (issue 32, steps 2 to 4): graph_walk.py reads it
as each caller may see it; graph_holder.py keeps one per query process.

What it holds, as numpy arrays (no Python object per row):
- **passage edges**: each (entity, chunk) pair some mention makes, whether one of those
  mentions is the chunk's title (``start_char = -1``: the entities a passage is *about*),
  sorted by entity then chunk, and the same edges sorted by chunk then entity;
- **entities**: id and mention count (the hub rule and the bridge budget), sorted by id;
- **relationships**: id, source, target, weight (float64, as stored: the walk's order and its
  log weights are then those of the database), type and whether it is weak, sorted by id,
  with their order by source and by target;
- **visibility** (issue 32, step 4), for a caller who sees part of the corpus: each passage
  edge's *access class* (its document's tenant and ACL: every document of a class is visible
  to the same callers) and number of mentions, and each relationship's evidence summed per
  class (strength and count). A caller's visible classes are a boolean mask over the classes
  (``AccessClasses.visible_to``); a walk then keeps the edges and evidence whose class the mask
  admits, which is what the database's visibility predicate (visibility.py) admits.

How it is built and kept current: one bulk read in an exact snapshot
(services/core/db/snapshots.py ``graph_snapshot``: every ``graph_changes`` id at or below its
watermark is in what it reads, every later change above it), then, at each refresh, the changes
between the held watermark and a new exact one: the passage edges and the row of each changed
entity and each changed relationship (with its evidence per class) are read again as that
snapshot shows them and replace the held ones; an ``access`` change (a chunk whose live
document's tenant or ACL changed, logged by every upsert that changes them, whatever its
content: services/indexer/graph_store/transaction.py) re-reads the chunk's class and the
evidence of the relationships it holds evidence for. A refresh returns a new state; the old one
stays whole for the queries reading it (one consistent state per query).

Tested by tests/integration/test_graph_memory.py (after any sequence of document events with
refreshes in between, the held state equals one built from the database) and by the curation
property of tests/integration/test_curations.py (the same through curations, undos and the
re-resolution of stored documents they cause)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.access import Caller
from services.core.db.snapshots import fetch_packed, graph_snapshot

Ids = NDArray[np.int64]
Flags = NDArray[np.bool_]
# Positions of rows in an order: int32 (4 bytes a row; 2^31 rows is past any one process's
# memory for these arrays).
Positions = NDArray[np.int32]


def _unset() -> NDArray[Any]:
    """An index not given: computed from the rows (any index of rows has one entry a row)."""
    return np.zeros(0, dtype=np.int64)


def _positions(order: NDArray[Any]) -> Positions:
    return order.astype(np.int32, copy=False)


# Refresh reads: each row's document tenant and ACL (coded into a class in Python).
_PASSAGE_EDGES_OF = text(
    "SELECT m.entity_id, m.chunk_id, bool_or(m.start_char = -1), d.tenant, d.acl, count(*)"
    " FROM mentions m JOIN documents d ON d.doc_id = m.doc_id WHERE m.entity_id = ANY(:ids)"
    " GROUP BY m.entity_id, m.chunk_id, d.tenant, d.acl"
)
_ENTITIES_OF = text("SELECT id, mention_count FROM entities WHERE id = ANY(:ids)")
_RELATIONSHIPS_OF = text(
    "SELECT id, source_id, target_id, weight, type, weak FROM relationships WHERE id = ANY(:ids)"
)
_EVIDENCE_OF = text(
    "SELECT ev.relationship_id, d.tenant, d.acl, sum(ev.strength), count(*)"
    " FROM relationship_evidence ev JOIN documents d ON d.doc_id = ev.doc_id"
    " WHERE ev.relationship_id = ANY(:ids) GROUP BY ev.relationship_id, d.tenant, d.acl"
)
# An access change: the chunks' classes now, and the relationships they evidence.
_CHUNK_CLASSES = text(
    "SELECT c.id, d.tenant, d.acl FROM chunks c JOIN documents d ON d.doc_id = c.doc_id"
    " WHERE c.id = ANY(:ids)"
)
_EVIDENCED_BY = text(
    "SELECT DISTINCT relationship_id FROM relationship_evidence WHERE chunk_id = ANY(:ids)"
)
# The bulk reads, packed (big-endian, as int8send / float8send / int4send / boolsend write
# them), one bytea per group of at most 2^20 keys; a relationship's type as its index in _TYPES,
# a document's access class as its index in _CLASSES (read in the same snapshot, in the order
# the codes are ranked in).
_EDGE_ROW = np.dtype([("entity", ">i8"), ("chunk", ">i8"), ("topic", "?"), ("n", ">i4")])
_CHUNK_ROW = np.dtype([("id", ">i8"), ("access", ">i4")])
_ENTITY_ROW = np.dtype([("id", ">i8"), ("mentions", ">i4")])
_REL_ROW = np.dtype(
    [
        ("id", ">i8"),
        ("src", ">i8"),
        ("dst", ">i8"),
        ("weight", ">f8"),
        ("type", ">i4"),
        ("weak", "?"),
        ("n", ">i4"),
    ]
)
_EVIDENCE_ROW = np.dtype([("id", ">i8"), ("chunk", ">i8"), ("strength", ">f8")])
# (tenant NULLS FIRST, acl NULLS FIRST): the order _CLASSES lists the classes in and
# _PACKED_CHUNK_CLASSES ranks their codes by (k: each document's code). A passage edge's and an
# evidence row's class is their chunk's, looked up in numpy: joining the millions of mentions
# and evidence rows to their documents in SQL tripled the build's time at 1M entities.
_CLASSES = text(
    "SELECT tenant, acl FROM documents GROUP BY tenant, acl"
    " ORDER BY tenant NULLS FIRST, acl NULLS FIRST"
)
_PACKED_CHUNK_CLASSES = (
    "WITH k AS (SELECT doc_id, (dense_rank() OVER"
    " (ORDER BY tenant NULLS FIRST, acl NULLS FIRST) - 1)::int AS code FROM documents)"
    " SELECT count(*), string_agg(int8send(c.id) || int4send(k.code), ''::bytea)"
    " FROM chunks c JOIN k ON k.doc_id = c.doc_id GROUP BY c.id >> 20"
)
_PACKED_PASSAGE_EDGES = (
    "SELECT count(*), string_agg(int8send(entity_id) || int8send(chunk_id) || boolsend(topic)"
    " || int4send(n), ''::bytea) FROM (SELECT entity_id, chunk_id,"
    " bool_or(start_char = -1) AS topic, count(*)::int AS n FROM mentions"
    " GROUP BY entity_id, chunk_id) m GROUP BY entity_id >> 20"
)
# Read only when the documents (tombstones included) fall into more than one class: with one,
# every relationship's evidence is in it, and its sum and count are the relationship's weight
# and evidence_count (the indexer keeps them so: graph_store/rebuild.py).
_PACKED_EVIDENCE = (
    "SELECT count(*), string_agg(int8send(relationship_id) || int8send(chunk_id)"
    " || float8send(strength), ''::bytea) FROM relationship_evidence"
    " GROUP BY relationship_id >> 20"
)
_PACKED_ENTITIES = (
    "SELECT count(*), string_agg(int8send(id) || int4send(mention_count), ''::bytea)"
    " FROM entities GROUP BY id >> 20"
)
_TYPES = text("SELECT array_agg(DISTINCT type ORDER BY type) FROM relationships")
# The codes are positions in the types just read (bound, so the two reads cannot disagree).
_PACKED_RELATIONSHIPS = (
    "WITH t AS (SELECT type, (n - 1)::int AS code"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS u(type, n))"
    " SELECT count(*), string_agg(int8send(r.id) || int8send(r.source_id)"
    " || int8send(r.target_id) || float8send(r.weight) || int4send(t.code) || boolsend(r.weak)"
    " || int4send(r.evidence_count), ''::bytea) FROM relationships r JOIN t USING (type)"
    " GROUP BY r.id >> 20"
)
_TOP = text("SELECT max(id) FROM graph_changes")
_CHANGES = text(
    "SELECT kind, ref_id FROM graph_changes WHERE id > :since AND id <= :until"
    " AND kind IN ('node', 'edge', 'access')"
)


def _ids(values: Sequence[int] | Ids) -> Ids:
    return np.asarray(values, dtype=np.int64).reshape(-1)


EdgeRow = tuple[int, int, bool, int, int]  # entity, chunk, title flag, class, mentions
EvidenceRow = tuple[int, int, float, int]  # relationship, class, strength sum, count
AccessKey = tuple[str | None, tuple[str, ...] | None]  # a document's (tenant, ACL)
# Callers whose masks a state's classes keep (one entry: a boolean a class); past it, the
# cache starts again (a mask is recomputed in one pass over the classes).
MASKS_KEPT = 256


def access_key(tenant: Any, acl: Any) -> AccessKey:
    return (None if tenant is None else str(tenant), None if acl is None else tuple(acl))


@dataclass(frozen=True)
class AccessClasses:
    """The distinct (tenant, ACL) pairs of documents, each coded by its position: every
    document of a class is visible to the same callers. Codes only grow: a refresh appends the
    classes it meets to a list its states share (a state sees the first ``size``), so a
    state's codes stay valid in the states refreshed from it, and neither the codes nor the
    callers' masks are rebuilt (one class per document keeps hundreds of thousands)."""

    size: int
    _keys: list[AccessKey] = field(default_factory=list, repr=False, compare=False)
    _codes: dict[AccessKey, int] = field(default_factory=dict, repr=False, compare=False)
    _masks: dict[tuple[str | None, frozenset[str]], Flags] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def of(cls, keys: Sequence[AccessKey]) -> AccessClasses:
        listed = list(keys)
        return cls(len(listed), listed, {k: i for i, k in enumerate(listed)})

    @property
    def keys(self) -> Sequence[AccessKey]:
        return self._keys[: self.size]

    def coded(self, pairs: Sequence[tuple[Any, Any]]) -> tuple[AccessClasses, NDArray[np.int32]]:
        """The codes of documents' (tenant, ACL) ``pairs``, and the classes extended by those
        not known yet (on the latest state of a line: a refresh; an older one starts a line of
        its own)."""
        if self.size != len(self._keys):
            return AccessClasses.of(self.keys).coded(pairs)
        keys = [access_key(tenant, acl) for tenant, acl in pairs]
        codes = self._codes
        for key in keys:
            if key not in codes:
                codes[key] = len(self._keys)
                self._keys.append(key)
        classes = self
        if len(self._keys) != self.size:
            classes = AccessClasses(len(self._keys), self._keys, codes, self._masks)
        return classes, np.array([codes[k] for k in keys], dtype=np.int32)

    def visible_to(self, caller: Caller) -> Flags:
        """Which classes the caller sees (``Caller.can_see``, the rule the SQL states)."""
        key = (caller.tenant, frozenset(caller.groups))
        mask = self._masks.get(key)
        if mask is None or len(mask) < self.size:
            done = np.zeros(0, dtype=np.bool_) if mask is None else mask
            more = [caller.can_see(t, acl) for t, acl in self._keys[len(done) : self.size]]
            mask = np.concatenate([done, np.array(more, dtype=np.bool_)])
            if len(self._masks) >= MASKS_KEPT:
                self._masks.clear()
            self._masks[key] = mask
        return mask[: self.size]


@dataclass(frozen=True)
class Relationships:
    """Relationships as parallel arrays, sorted by id; a type as its index in ``vocabulary``
    (int32: an LLM may name many types). ``by_source`` / ``by_target``: the rows in source
    (target) order, and ``source_keys`` / ``target_keys`` the sources (targets) in that order,
    for the walk's lookups; computed when not given."""

    ids: Ids
    sources: Ids
    targets: Ids
    weights: NDArray[np.float64]
    types: NDArray[np.int32]
    weak: Flags
    vocabulary: tuple[str, ...]
    by_source: Positions = field(default_factory=_unset, repr=False, compare=False)
    source_keys: Ids = field(default_factory=_unset, repr=False, compare=False)
    by_target: Positions = field(default_factory=_unset, repr=False, compare=False)
    target_keys: Ids = field(default_factory=_unset, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.by_source) != len(self.ids):
            order = _positions(np.argsort(self.sources, kind="stable"))
            object.__setattr__(self, "by_source", order)
            object.__setattr__(self, "source_keys", self.sources[order])
        if len(self.by_target) != len(self.ids):
            order = _positions(np.argsort(self.targets, kind="stable"))
            object.__setattr__(self, "by_target", order)
            object.__setattr__(self, "target_keys", self.targets[order])

    @classmethod
    def of(cls, rows: Sequence[Any], vocabulary: tuple[str, ...] = ()) -> Relationships:
        """From (id, source, target, weight, type, weak) rows; types coded in ``vocabulary``
        extended by the names it lacks."""
        rows = sorted(rows, key=lambda r: int(r[0]))
        extra = sorted({str(r[4]) for r in rows} - set(vocabulary))
        vocabulary = (*vocabulary, *extra)
        code = {t: i for i, t in enumerate(vocabulary)}
        return cls(
            _ids([int(r[0]) for r in rows]),
            _ids([int(r[1]) for r in rows]),
            _ids([int(r[2]) for r in rows]),
            np.array([float(r[3]) for r in rows], dtype=np.float64),
            np.array([code[str(r[4])] for r in rows], dtype=np.int32),
            np.array([bool(r[5]) for r in rows], dtype=np.bool_),
            vocabulary,
        )

    def sorted_by_id(self) -> Relationships:
        order = np.argsort(self.ids, kind="stable")
        return Relationships(
            self.ids[order],
            self.sources[order],
            self.targets[order],
            self.weights[order],
            self.types[order],
            self.weak[order],
            self.vocabulary,
        )

    def replaced(self, changed: Ids, rows: Sequence[Any]) -> Relationships:
        """The rows of ``changed`` ids (sorted, distinct) replaced by ``rows`` (what the
        database now holds of them; a removed relationship has none), in time linear in the
        rows held: no sort of what did not change."""
        fresh = Relationships.of(rows, self.vocabulary)
        deleted, _ = _present(self.ids, changed)
        kept_ids = np.delete(self.ids, deleted)
        inserted_at = np.searchsorted(kept_ids, fresh.ids)
        ids = np.insert(kept_ids, inserted_at, fresh.ids)
        change = {"deleted": deleted, "inserted_at": inserted_at}
        by_source, source_keys = _reordered(
            self.by_source,
            self.source_keys,
            deleted_keys=self.sources[deleted],
            inserted_keys=fresh.sources,
            **change,
        )
        by_target, target_keys = _reordered(
            self.by_target,
            self.target_keys,
            deleted_keys=self.targets[deleted],
            inserted_keys=fresh.targets,
            **change,
        )
        return Relationships(
            ids,
            _patched(self.sources, deleted, inserted_at, fresh.sources),
            _patched(self.targets, deleted, inserted_at, fresh.targets),
            _patched(self.weights, deleted, inserted_at, fresh.weights),
            _patched(self.types, deleted, inserted_at, fresh.types),
            _patched(self.weak, deleted, inserted_at, fresh.weak),
            fresh.vocabulary,
            by_source,
            source_keys,
            by_target,
            target_keys,
        )

    def type_names(self) -> list[str]:
        return [self.vocabulary[int(c)] for c in self.types]

    def leaving(self, entities: Ids) -> NDArray[Any]:
        """Rows (positions) whose source is one of ``entities`` (sorted, distinct)."""
        found: NDArray[Any] = self.by_source[_with_keys(self.source_keys, entities)]
        return found

    def entering(self, entities: Ids) -> NDArray[Any]:
        """Rows (positions) whose target is one of ``entities`` (sorted, distinct)."""
        found: NDArray[Any] = self.by_target[_with_keys(self.target_keys, entities)]
        return found

    def touching(self, entities: Ids) -> NDArray[Any]:
        """Rows (positions) whose source or target is one of ``entities``, each once, sorted."""
        return np.unique(np.concatenate([self.leaving(entities), self.entering(entities)]))

    def indexes_hold(self) -> bool:
        """Whether both orders are permutations of the rows in key order (tests)."""
        sources = _is_order(self.by_source, self.sources, self.source_keys)
        return sources and _is_order(self.by_target, self.targets, self.target_keys)

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.sources, self.targets, self.weights, self.types, self.weak)
        index = sum(a.nbytes for a in (self.by_source, self.source_keys))
        index += sum(a.nbytes for a in (self.by_target, self.target_keys))
        return sum(a.nbytes for a in arrays) + index + sum(len(t) for t in self.vocabulary)


def _patched(
    values: NDArray[Any], deleted: Ids, inserted_at: Ids, inserted: NDArray[Any]
) -> NDArray[Any]:
    """``values`` without the rows at ``deleted``, with ``inserted`` put before the kept rows at
    ``inserted_at`` (nondecreasing positions among the kept rows, as np.insert takes them)."""
    return np.insert(np.delete(values, deleted), inserted_at, inserted)


def _present(sorted_ids: Ids, wanted: Ids) -> tuple[Ids, Flags]:
    """(the positions of those of ``wanted`` that are in ``sorted_ids``, which of ``wanted``
    they are): ``wanted`` sorted and distinct, so the positions are too."""
    at = np.searchsorted(sorted_ids, wanted)
    found = np.zeros(len(wanted), dtype=np.bool_)
    inside = at < len(sorted_ids)
    found[inside] = sorted_ids[at[inside]] == wanted[inside]
    return at[found], found


def _with_keys(sorted_keys: Ids, wanted: Ids) -> Ids:
    """Positions in ``sorted_keys`` of every entry whose key is in ``wanted`` (distinct),
    sorted."""
    lo = np.searchsorted(sorted_keys, wanted, side="left")
    hi = np.searchsorted(sorted_keys, wanted, side="right")
    return _spans(lo, hi)


def _reordered(
    order: Positions,
    sorted_keys: Ids,
    *,
    deleted: Ids,
    deleted_keys: Ids,
    inserted_at: Ids,
    inserted_keys: Ids,
) -> tuple[Positions, Ids]:
    """An order of the rows by key and the keys in that order, kept through a change that
    deleted the rows at ``deleted`` (old positions, sorted; their keys ``deleted_keys``) and
    inserted rows with ``inserted_keys`` at ``inserted_at`` (as np.insert takes them): the
    deleted rows found by their keys, the kept rows' positions moved, the new rows placed
    among them by key (ties after). Linear copies only: no gather of the whole order."""
    candidates = _with_keys(sorted_keys, np.unique(deleted_keys))
    at = candidates[np.isin(order[candidates], deleted)]
    kept, keys = np.delete(order, at), np.delete(sorted_keys, at)
    if deleted.size:
        kept = kept - np.searchsorted(deleted, kept)  # positions after the deletion
    if inserted_at.size:
        kept = kept + np.searchsorted(inserted_at, kept, side="right")  # after the insertion
    new_rows = inserted_at + np.arange(len(inserted_at), dtype=np.int64)
    by_key = np.argsort(inserted_keys, kind="stable")
    spots = np.searchsorted(keys, inserted_keys[by_key], side="right")
    order = _positions(np.insert(kept, spots, new_rows[by_key]))
    return order, np.insert(keys, spots, inserted_keys[by_key])


def _is_order(order: Positions, keys: NDArray[Any], sorted_keys: Ids) -> bool:
    """Whether ``order`` is a permutation of the rows that sorts ``keys`` and ``sorted_keys``
    are the keys in that order."""
    every = len(order) == len(keys) and np.array_equal(np.sort(order), np.arange(len(keys)))
    ordered = every and np.array_equal(keys[order], sorted_keys)
    return bool(ordered and np.all(np.diff(sorted_keys) >= 0))


@dataclass(frozen=True)
class PassageEdges:
    """(entity, chunk) pairs with their title flag, their document's access class and their
    number of mentions, sorted by entity then chunk; ``by_chunk`` holds the positions in chunk
    order (ties in any order: the walk reads a passage's edges as a set) and ``chunk_keys`` the
    chunks in that order; computed when not given."""

    entities: Ids
    chunks: Ids
    topics: Flags
    classes: NDArray[np.int32]
    mentions: NDArray[np.int32]
    by_chunk: Positions = field(default_factory=_unset, repr=False, compare=False)
    chunk_keys: Ids = field(default_factory=_unset, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.by_chunk) != len(self.entities):
            order = _positions(np.lexsort((self.entities, self.chunks)))
            object.__setattr__(self, "by_chunk", order)
        if len(self.chunk_keys) != len(self.entities):
            object.__setattr__(self, "chunk_keys", self.chunks[self.by_chunk])

    @classmethod
    def sorted_of(
        cls,
        entities: Ids,
        chunks: Ids,
        topics: Flags,
        classes: NDArray[np.int32],
        mentions: NDArray[np.int32],
    ) -> PassageEdges:
        order = np.lexsort((chunks, entities))
        return cls(entities[order], chunks[order], topics[order], classes[order], mentions[order])

    def replaced(self, changed: Ids, rows: Sequence[EdgeRow]) -> PassageEdges:
        """The edges of ``changed`` entities (sorted, distinct) replaced by ``rows`` (entity,
        chunk, title flag, class, mentions: their edges now), in time linear in the edges
        held: no sort of what did not change."""
        fresh = PassageEdges.sorted_of(*_edge_rows(rows))
        deleted = self.of_entities(changed)
        kept_entities = np.delete(self.entities, deleted)
        inserted_at = np.searchsorted(kept_entities, fresh.entities)
        by_chunk, chunk_keys = _reordered(
            self.by_chunk,
            self.chunk_keys,
            deleted=deleted,
            deleted_keys=self.chunks[deleted],
            inserted_at=inserted_at,
            inserted_keys=fresh.chunks,
        )
        return PassageEdges(
            np.insert(kept_entities, inserted_at, fresh.entities),
            _patched(self.chunks, deleted, inserted_at, fresh.chunks),
            _patched(self.topics, deleted, inserted_at, fresh.topics),
            _patched(self.classes, deleted, inserted_at, fresh.classes),
            _patched(self.mentions, deleted, inserted_at, fresh.mentions),
            by_chunk,
            chunk_keys,
        )

    def reclassed(self, chunks: Ids, classes: NDArray[np.int32]) -> PassageEdges:
        """The edges of ``chunks`` (sorted, distinct) in the ``classes`` given (one each):
        their document's tenant or ACL changed."""
        at = self.of_chunks(chunks)
        if not at.size:
            return self
        moved = self.classes.copy()
        moved[at] = classes[np.searchsorted(chunks, self.chunks[at])]
        return PassageEdges(
            self.entities,
            self.chunks,
            self.topics,
            moved,
            self.mentions,
            self.by_chunk,
            self.chunk_keys,
        )

    def of_entities(self, entities: Ids) -> Ids:
        """Positions of the edges of these entities (sorted, each once)."""
        return _with_keys(self.entities, entities)

    def of_chunks(self, chunks: Ids) -> Positions:
        """Positions (in entity order) of the edges of these chunks."""
        return self.by_chunk[_with_keys(self.chunk_keys, chunks)]

    def index_holds(self) -> bool:
        """Whether ``by_chunk`` orders the edges by chunk and ``chunk_keys`` follows it (tests)."""
        return _is_order(self.by_chunk, self.chunks, self.chunk_keys)

    @property
    def nbytes(self) -> int:
        arrays = (self.entities, self.chunks, self.topics, self.classes, self.mentions)
        return sum(a.nbytes for a in (*arrays, self.by_chunk, self.chunk_keys))


def _spans(lo: Ids, hi: Ids) -> Ids:
    """The positions lo[i] <= p < hi[i] of every i (``lo``/``hi`` from distinct sorted keys, so
    the spans do not overlap), sorted."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not lo.size:
        return np.zeros(0, dtype=np.int64)
    lengths = hi - lo
    starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
    positions = starts + np.arange(int(lengths.sum()), dtype=np.int64)
    return np.sort(positions)


@dataclass(frozen=True)
class EntityCounts:
    """Every entity's id (sorted) and mention count."""

    ids: Ids
    mentions: NDArray[np.int32]

    def of(self, entities: Ids) -> tuple[Ids, NDArray[np.int32]]:
        """(ids, counts) of those of ``entities`` (sorted, distinct) that exist."""
        at, found = _present(self.ids, entities)
        return entities[found], self.mentions[at]

    def replaced(self, changed: Ids, rows: Sequence[Any]) -> EntityCounts:
        """The counts of ``changed`` entities (sorted, distinct) replaced by ``rows`` (id,
        count; a removed entity has none)."""
        fresh = sorted((int(r[0]), int(r[1])) for r in rows)
        new_ids = _ids([i for i, _ in fresh])
        deleted, _ = _present(self.ids, changed)
        kept = np.delete(self.ids, deleted)
        inserted_at = np.searchsorted(kept, new_ids)
        counts = np.array([n for _, n in fresh], dtype=np.int32)
        return EntityCounts(
            np.insert(kept, inserted_at, new_ids),
            _patched(self.mentions, deleted, inserted_at, counts),
        )


@dataclass(frozen=True)
class Evidence:
    """Each relationship's evidence summed per access class: (relationship id, class) rows
    sorted by id, with the strengths' sum and the count. A restricted caller's weight of a
    relationship is the sum over the classes it sees (the indexer's rule on visible evidence:
    visibility.visible_evidence)."""

    ids: Ids
    classes: NDArray[np.int32]
    strengths: NDArray[np.float64]
    counts: NDArray[np.int32]

    @classmethod
    def of(cls, rows: Sequence[EvidenceRow]) -> Evidence:
        """From (relationship id, class, strength sum, count) rows."""
        rows = sorted(rows)
        return cls(
            _ids([r[0] for r in rows]),
            np.array([r[1] for r in rows], dtype=np.int32),
            np.array([r[2] for r in rows], dtype=np.float64),
            np.array([r[3] for r in rows], dtype=np.int32),
        )

    @classmethod
    def of_one_class(
        cls, ids: NDArray[Any], weights: NDArray[Any], counts: NDArray[Any]
    ) -> Evidence:
        """Every document in class 0: each relationship's evidence is its weight and count."""
        order = np.argsort(ids, kind="stable")
        order = order[np.asarray(counts)[order] > 0]
        return cls(
            np.asarray(ids, dtype=np.int64)[order],
            np.zeros(len(order), dtype=np.int32),
            np.asarray(weights, dtype=np.float64)[order],
            np.asarray(counts, dtype=np.int32)[order],
        )

    @classmethod
    def summed(
        cls, ids: Ids, classes: NDArray[np.int32], strengths: NDArray[np.float64]
    ) -> Evidence:
        """From evidence rows (relationship, class, strength): summed and counted per
        (relationship, class)."""
        order = np.lexsort((classes, ids))
        ids, classes, strengths = ids[order], classes[order], strengths[order]
        first = np.ones(len(ids), dtype=np.bool_)
        first[1:] = (ids[1:] != ids[:-1]) | (classes[1:] != classes[:-1])
        starts = np.flatnonzero(first)
        if not starts.size:
            return cls.of([])
        return cls(
            ids[starts],
            classes[starts],
            np.add.reduceat(strengths, starts),
            np.diff(np.append(starts, len(ids))).astype(np.int32),
        )

    def replaced(self, changed: Ids, rows: Sequence[EvidenceRow]) -> Evidence:
        """The rows of ``changed`` relationships (sorted, distinct) replaced by ``rows``."""
        fresh = Evidence.of(rows)
        deleted = _with_keys(self.ids, changed)
        kept = np.delete(self.ids, deleted)
        at = np.searchsorted(kept, fresh.ids)
        return Evidence(
            np.insert(kept, at, fresh.ids),
            _patched(self.classes, deleted, at, fresh.classes),
            _patched(self.strengths, deleted, at, fresh.strengths),
            _patched(self.counts, deleted, at, fresh.counts),
        )

    def visible(
        self, relationships: Ids, seen: Flags
    ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """(weight, evidence count) of each of ``relationships`` (sorted, distinct) from the
        evidence in the classes ``seen`` admits."""
        at = _with_keys(self.ids, relationships)
        group = np.searchsorted(relationships, self.ids[at])
        shown = seen[self.classes[at]]
        n = len(relationships)
        weights: NDArray[np.float64] = np.bincount(
            group[shown], weights=self.strengths[at][shown], minlength=n
        ).astype(np.float64)
        counts = np.bincount(group[shown], weights=self.counts[at][shown], minlength=n)
        return weights, counts.astype(np.int64)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.ids, self.classes, self.strengths, self.counts))


@dataclass(frozen=True)
class MemoryGraph:
    """One consistent state of the walked graph, as of ``watermark``."""

    watermark: int
    edges: PassageEdges
    entity_counts: EntityCounts
    relationships: Relationships
    evidence: Evidence
    classes: AccessClasses

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (indexes included) and of the type names."""
        counts = self.entity_counts.ids.nbytes + self.entity_counts.mentions.nbytes
        held = self.edges.nbytes + counts + self.relationships.nbytes + self.evidence.nbytes
        return held + 64 * self.classes.size  # about, a class key

    def canonical(self) -> dict[str, list[tuple[Any, ...]]]:
        """The state as comparable data (tests): classes by their keys (their codes depend on
        the order they were met in)."""
        r, e, v, keys = self.relationships, self.edges, self.evidence, self.classes.keys
        return {
            "passage_edges": list(
                zip(
                    e.entities.tolist(),
                    e.chunks.tolist(),
                    e.topics.tolist(),
                    [keys[c] for c in e.classes.tolist()],
                    e.mentions.tolist(),
                    strict=True,
                )
            ),
            "entities": list(
                zip(
                    self.entity_counts.ids.tolist(),
                    self.entity_counts.mentions.tolist(),
                    strict=True,
                )
            ),
            "indexes_hold": [(e.index_holds(), r.indexes_hold())],
            "relationships": [
                (i, s, t, w, k, weak)
                for i, s, t, w, k, weak in zip(
                    r.ids.tolist(),
                    r.sources.tolist(),
                    r.targets.tolist(),
                    r.weights.tolist(),
                    r.type_names(),
                    r.weak.tolist(),
                    strict=True,
                )
            ],
            # by relationship, then class key (repr: a tenant or an ACL may be None)
            "evidence": sorted(
                (
                    (i, keys[c], round(w, 9), n)
                    for i, c, w, n in zip(
                        v.ids.tolist(),
                        v.classes.tolist(),
                        v.strengths.tolist(),
                        v.counts.tolist(),
                        strict=True,
                    )
                ),
                key=lambda row: (row[0], repr(row[1])),
            ),
        }


def _edge_rows(
    rows: Sequence[EdgeRow],
) -> tuple[Ids, Ids, Flags, NDArray[np.int32], NDArray[np.int32]]:
    return (
        _ids([r[0] for r in rows]),
        _ids([r[1] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.bool_),
        np.array([r[3] for r in rows], dtype=np.int32),
        np.array([r[4] for r in rows], dtype=np.int32),
    )


async def _read_all(conn: AsyncConnection, watermark: int) -> MemoryGraph:
    """Every passage edge, entity, relationship and evidence sum, packed by the server into
    fixed-width binary records (services/core/db/snapshots.py ``fetch_packed``: no Python
    object per row)."""
    classes = AccessClasses.of([access_key(t, a) for t, a in (await conn.execute(_CLASSES)).all()])
    coded = await fetch_packed(conn, _PACKED_CHUNK_CLASSES, _CHUNK_ROW)
    order = np.argsort(coded["id"], kind="stable")
    chunk_ids, chunk_classes = coded["id"].astype(np.int64)[order], coded["access"][order]
    del coded

    def class_of(chunks: Ids) -> NDArray[np.int32]:
        return chunk_classes[np.searchsorted(chunk_ids, chunks)].astype(np.int32)

    edges = await fetch_packed(conn, _PACKED_PASSAGE_EDGES, _EDGE_ROW)
    entities = await fetch_packed(conn, _PACKED_ENTITIES, _ENTITY_ROW)
    types = [str(t) for t in (await conn.scalar(_TYPES)) or []]
    rels = await fetch_packed(conn, _PACKED_RELATIONSHIPS, _REL_ROW, (types,))
    relationships = Relationships(
        rels["id"].astype(np.int64),
        rels["src"].astype(np.int64),
        rels["dst"].astype(np.int64),
        rels["weight"].astype(np.float64),
        rels["type"].astype(np.int32),
        rels["weak"].astype(np.bool_),
        tuple(types),
    ).sorted_by_id()
    order = np.argsort(entities["id"], kind="stable")
    counts = EntityCounts(
        entities["id"].astype(np.int64)[order], entities["mentions"].astype(np.int32)[order]
    )
    edge_chunks = edges["chunk"].astype(np.int64)
    passage_edges = PassageEdges.sorted_of(
        edges["entity"].astype(np.int64),
        edge_chunks,
        edges["topic"].astype(np.bool_),
        class_of(edge_chunks),
        edges["n"].astype(np.int32),
    )
    if classes.size <= 1:
        evidence = Evidence.of_one_class(rels["id"], rels["weight"], rels["n"])
    else:
        rows = await fetch_packed(conn, _PACKED_EVIDENCE, _EVIDENCE_ROW)
        evidence = Evidence.summed(
            rows["id"].astype(np.int64),
            class_of(rows["chunk"].astype(np.int64)),
            rows["strength"].astype(np.float64),
        )
    return MemoryGraph(watermark, passage_edges, counts, relationships, evidence, classes)


async def build(engine: AsyncEngine) -> MemoryGraph:
    """The whole walked graph in one bulk read of an exact snapshot."""
    async with graph_snapshot(engine) as (conn, watermark):
        return await _read_all(conn, watermark)


async def shown_by(conn: AsyncConnection, held: MemoryGraph) -> bool:
    """Whether ``conn``'s snapshot shows every change ``held`` holds (its last graph change at
    or past the watermark): a replica's read may be behind the primary the graph is read
    from. Changes commit in about id order; one that committed after a larger id is the only
    gap, the same window a read already has for a passage deleted after the walk found it."""
    top = await conn.scalar(_TOP)
    return int(top or 0) >= held.watermark


async def refresh(engine: AsyncEngine, held: MemoryGraph) -> MemoryGraph:
    """``held`` brought up to a new exact snapshot by the changes since its watermark (itself
    when nothing changed). Nothing committed above the held watermark is seen without the
    exact snapshot's brief lock (every id at or below it was committed when it was taken, so
    a later change has a larger id): an idle graph costs its writers nothing."""
    async with engine.connect() as conn:
        top = await conn.scalar(_TOP)
    if top is None or int(top) <= held.watermark:
        return held
    async with graph_snapshot(engine) as (conn, watermark):
        if watermark == held.watermark:
            return held
        rows = (await conn.execute(_CHANGES, {"since": held.watermark, "until": watermark})).all()
        return await _changed(conn, held, watermark, rows)


def _changed_ids(rows: Sequence[Any], kind: str) -> Ids:
    return _ids(sorted({int(r[1]) for r in rows if r[0] == kind}))


async def _changed(
    conn: AsyncConnection, held: MemoryGraph, watermark: int, rows: Sequence[Any]
) -> MemoryGraph:
    """``held`` with the changes ``rows`` (kind, ref_id) read again in ``conn``'s snapshot."""
    nodes, accessed = _changed_ids(rows, "node"), _changed_ids(rows, "access")
    changed_edges = _changed_ids(rows, "edge")
    edges, counts, classes = held.edges, held.entity_counts, held.classes
    if nodes.size:
        fresh = (await conn.execute(_PASSAGE_EDGES_OF, {"ids": nodes.tolist()})).all()
        classes, codes = classes.coded([(r[3], r[4]) for r in fresh])
        coded = [(r[0], r[1], r[2], c, r[5]) for r, c in zip(fresh, codes.tolist(), strict=True)]
        edges = edges.replaced(nodes, coded)
        rows_of = (await conn.execute(_ENTITIES_OF, {"ids": nodes.tolist()})).all()
        counts = counts.replaced(nodes, rows_of)
    if accessed.size:
        ids = {"ids": accessed.tolist()}
        now = sorted((await conn.execute(_CHUNK_CLASSES, ids)).all(), key=lambda r: int(r[0]))
        classes, codes = classes.coded([(r[1], r[2]) for r in now])
        edges = edges.reclassed(_ids([r[0] for r in now]), codes)
        evidenced = (await conn.execute(_EVIDENCED_BY, ids)).scalars().all()
        changed_edges = np.union1d(changed_edges, _ids(evidenced))
    relationships, evidence = held.relationships, held.evidence
    if changed_edges.size:
        ids = {"ids": changed_edges.tolist()}
        fresh_rels = (await conn.execute(_RELATIONSHIPS_OF, ids)).all()
        relationships = relationships.replaced(changed_edges, fresh_rels)
        sums = (await conn.execute(_EVIDENCE_OF, ids)).all()
        classes, codes = classes.coded([(r[1], r[2]) for r in sums])
        evidence = evidence.replaced(
            changed_edges,
            [
                (int(r[0]), c, float(r[3]), int(r[4]))
                for r, c in zip(sums, codes.tolist(), strict=True)
            ],
        )
    return MemoryGraph(watermark, edges, counts, relationships, evidence, classes)
