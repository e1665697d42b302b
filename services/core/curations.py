"""The curations table: rules people make about entity resolution (merge, alias, block, split,
rename), who made them, when and why, and whether the documents they touch have been resolved
again under them. Shared by the API and the CLI (which make rules), and the indexer (which
reads the rules in force at every ingest and applies new ones to the documents they touch:
services/indexer/curation_apply.py). The rules themselves: services/core/curation_rules.py.

Consistency: ``kg_meta['curation_version']`` counts rule changes. A rule change takes an
exclusive transaction-scoped advisory lock while it checks and writes; every event transaction
that resolves entities takes it shared (``hold_rules``), reads the version, and raises
StaleComputeError when its plan was computed under another one. So an event either commits
before a rule change (and the change's apply resolves its document again) or is planned again
under the new rules. Advisory locks queue fairly: a rule change waits for the event
transactions in flight, not for every one that starts after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.curation_rules import MAX_REDIRECTS, CurationRules
from services.core.errors import KgstreamError, StaleComputeError
from services.core.normalize import entity_key

Kind = Literal["merge", "alias", "block", "split", "rename"]
KINDS: tuple[Kind, ...] = get_args(Kind)
REDIRECTS: frozenset[str] = frozenset({"merge", "alias", "rename"})
BLOCKS: frozenset[str] = frozenset({"block", "split"})
Status = Literal["pending", "applied", "undoing", "undone"]
MAX_NAME = 300
MAX_REASON = 2000


class CurationError(KgstreamError):
    """A curation that cannot be made: ``code`` is ``invalid`` (bad input), ``not_found`` (a
    name it needs has no entity) or ``conflict`` (another rule in force contradicts it)."""

    def __init__(self, code: Literal["invalid", "not_found", "conflict"], detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Curation:
    """One row of the curations table."""

    id: int
    kind: Kind
    name_a: str
    name_b: str
    reason: str
    created_by: str
    created_at: datetime
    applied_at: datetime | None
    undone_by: str | None
    undone_at: datetime | None
    undo_reason: str | None
    undo_applied_at: datetime | None

    @property
    def status(self) -> Status:
        """pending (made, its documents not resolved again yet), applied, undoing, undone."""
        if self.undone_at is not None:
            return "undone" if self.undo_applied_at is not None else "undoing"
        return "applied" if self.applied_at is not None else "pending"

    def as_json(self) -> dict[str, Any]:
        """The row for people and programs (``curate list --json``, ``/v1/curations``)."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "name": self.name_a,
            ("new_name" if self.kind == "rename" else "other"): self.name_b,
            "reason": self.reason,
            "created_by": self.created_by,
            "created_at": self.created_at.isoformat(),
            "status": self.status,
            "applied_at": _iso(self.applied_at),
        }
        if self.undone_at is not None:
            out |= {
                "undone_by": self.undone_by,
                "undone_at": _iso(self.undone_at),
                "undo_reason": self.undo_reason,
                "undo_applied_at": _iso(self.undo_applied_at),
            }
        return out

    def describe(self) -> str:
        """One line for people."""
        what = {
            "merge": f"merge {self.name_a!r} <- {self.name_b!r}",
            "alias": f"alias {self.name_b!r} -> {self.name_a!r}",
            "block": f"block {self.name_a!r} / {self.name_b!r}",
            "split": f"split {self.name_b!r} from {self.name_a!r}",
            "rename": f"rename {self.name_a!r} -> {self.name_b!r}",
        }[self.kind]
        return f"#{self.id} {what} [{self.status}] by {self.created_by}: {self.reason or '-'}"


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


_COLUMNS = (
    "id, kind, name_a, name_b, reason, created_by, created_at, applied_at, undone_by,"
    " undone_at, undo_reason, undo_applied_at"
)
_RULES = text(
    "SELECT v.v AS version, c.kind, c.key_a, c.key_b FROM (SELECT value::bigint AS v FROM"
    " kg_meta WHERE key = 'curation_version') v LEFT JOIN curations c ON c.undone_at IS NULL"
    " ORDER BY c.id"
)
_VERSION = text("SELECT value::bigint FROM kg_meta WHERE key = 'curation_version'")
# pg_advisory_xact_lock key of the rules: "kgrules" in ASCII.
RULES_LOCK = 0x6B6772756C6573
_HOLD = text(f"SELECT pg_advisory_xact_lock_shared({RULES_LOCK})")
_LOCK = text(f"SELECT pg_advisory_xact_lock({RULES_LOCK})")
_BUMP = text("UPDATE kg_meta SET value = (value::bigint + 1)::text WHERE key = 'curation_version'")
_INSERT = text(
    "INSERT INTO curations (kind, name_a, key_a, name_b, key_b, reason, created_by)"  # noqa: S608
    f" VALUES (:kind, :na, :ka, :nb, :kb, :reason, :by) RETURNING {_COLUMNS}"
)
_UNDO = text(
    "UPDATE curations SET undone_at = now(), undone_by = :by, undo_reason = :reason"  # noqa: S608
    f" WHERE id = :id AND undone_at IS NULL RETURNING {_COLUMNS}"
)
_ONE = text(f"SELECT {_COLUMNS} FROM curations WHERE id = :id")  # noqa: S608 - constants
_LIST = text(f"SELECT {_COLUMNS} FROM curations ORDER BY id")  # noqa: S608 - constants
_ENTITY = text("SELECT 1 FROM entities WHERE key = :k LIMIT 1")
# A rule in force that says the same (blocks either way round), or the rename in force of a key.
_SAME = text(
    f"SELECT {_COLUMNS} FROM curations WHERE undone_at IS NULL AND ("  # noqa: S608 - constants
    " (kind = :kind AND key_a = :ka AND key_b = :kb AND (kind <> 'rename' OR name_b = :nb))"
    " OR (kind IN ('block', 'split') AND :kind IN ('block', 'split')"
    "     AND key_a = :kb AND key_b = :ka)) ORDER BY id LIMIT 1"
)
_RENAMED = text(
    "SELECT id FROM curations WHERE undone_at IS NULL AND kind = 'rename' AND key_a = :ka"
    " ORDER BY id LIMIT 1"
)
_MERGED = text(
    "SELECT 1 FROM aliases a JOIN entities e ON e.id = a.entity_id"
    " WHERE a.alias_key = :b AND e.key = :a LIMIT 1"
)


async def load_rules(conn: AsyncConnection) -> CurationRules:
    """The rules in force now, with their version (one statement: one snapshot)."""
    version = 0
    redirects: dict[str, str] = {}
    blocks: set[frozenset[str]] = set()
    for r in (await conn.execute(_RULES)).all():
        version = int(r.version)
        if r.kind in REDIRECTS and r.key_a != r.key_b:
            redirects[str(r.key_b)] = str(r.key_a)
        elif r.kind in BLOCKS:
            blocks.add(frozenset((str(r.key_a), str(r.key_b))))
    return CurationRules(version, redirects, frozenset(blocks))


class RulesCache:
    """The rules in force, read again only when their version moves (one small read a batch)."""

    def __init__(self) -> None:
        self._rules = CurationRules(version=-1)

    async def current(self, conn: AsyncConnection) -> CurationRules:
        """The rules as of now."""
        if await rules_version(conn) != self._rules.version:
            self._rules = await load_rules(conn)
        return self._rules


async def rules_version(conn: AsyncConnection) -> int:
    """``kg_meta['curation_version']``: how many rule changes there have been."""
    return int(await conn.scalar(_VERSION) or 0)


async def hold_rules(conn: AsyncConnection, rules: CurationRules) -> None:
    """In an event's transaction: keep the rules from changing until commit, and check the plan
    was resolved under the rules in force (StaleComputeError otherwise: plan it again)."""
    await conn.execute(_HOLD)
    # A statement of its own: a snapshot taken after the lock.
    if await rules_version(conn) != rules.version:
        raise StaleComputeError("curations changed since the event was planned; recomputing")


def _name(value: str, what: str) -> tuple[str, str]:
    name = " ".join(value.split())
    if not name:
        raise CurationError("invalid", f"{what} is empty")
    if len(name) > MAX_NAME:
        raise CurationError("invalid", f"{what} is longer than {MAX_NAME} characters")
    key = entity_key(name)
    if not key:
        raise CurationError("invalid", f"{what} {name!r} has no letter or digit")
    return name, key


async def create(
    engine: AsyncEngine,
    kind: str,
    name: str,
    other: str,
    *,
    reason: str,
    by: str,
    against_graph: bool = True,
    keys: tuple[str, str] | None = None,
) -> tuple[Curation, bool]:
    """Record a rule (``other`` is the second name, or the new name of a rename). Checked
    against the rules in force and, unless ``against_graph`` is False (rules carried into a
    database being rebuilt: ``kgstream curate import``), against the graph: the names a
    merge, split or rename needs must name entities. CurationError says why it cannot be
    made. ``keys``: the two names' keys when the caller has them from the graph (an entity's
    display name need not normalise to its key). Returns the curation and whether it is new: a
    rule that says what one in force says already is not made twice (the one in force is
    returned)."""
    if kind not in KINDS:
        raise CurationError("invalid", f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if len(reason) > MAX_REASON:
        raise CurationError("invalid", f"reason is longer than {MAX_REASON} characters")
    name_a, key_a = _name(name, "name")
    name_b, key_b = _name(other, "new name" if kind == "rename" else "other name")
    if keys is not None:
        key_a, key_b = keys
    if key_a == key_b and kind != "rename":
        raise CurationError(
            "invalid",
            f"{name_a!r} and {name_b!r} are one name to resolution (key {key_a!r}): a rule"
            " by name cannot tell them apart or join them",
        )
    async with engine.begin() as conn:
        await conn.execute(_LOCK)
        same = (
            await conn.execute(_SAME, {"kind": kind, "ka": key_a, "kb": key_b, "nb": name_b})
        ).one_or_none()
        if same is not None:
            return _curation(same), False
        if kind == "rename" and (renamed := await conn.scalar(_RENAMED, {"ka": key_a})):
            raise CurationError("conflict", f"{name_a!r} is renamed by #{renamed}: undo it first")
        rules = await load_rules(conn)
        if against_graph:
            await _check_graph(conn, kind, name_a=name_a, key_a=key_a, name_b=name_b, key_b=key_b)
        _check_rules(kind, name_a=name_a, key_a=key_a, name_b=name_b, key_b=key_b, rules=rules)
        row = (
            await conn.execute(
                _INSERT,
                {
                    "kind": kind,
                    "na": name_a,
                    "ka": key_a,
                    "nb": name_b,
                    "kb": key_b,
                    "reason": reason.strip(),
                    "by": by,
                },
            )
        ).one()
        await conn.execute(_BUMP)
    return _curation(row), True


async def _check_graph(
    conn: AsyncConnection, kind: str, *, name_a: str, key_a: str, name_b: str, key_b: str
) -> None:
    if kind in ("merge", "rename", "split") and await conn.scalar(_ENTITY, {"k": key_a}) is None:
        raise CurationError("not_found", f"no entity is named {name_a!r}")
    if kind == "merge" and await conn.scalar(_ENTITY, {"k": key_b}) is None:
        hint = "; `alias` makes a rule for a name not seen yet"
        raise CurationError("not_found", f"no entity is named {name_b!r}{hint}")
    if kind == "split" and await conn.scalar(_MERGED, {"a": key_a, "b": key_b}) is None:
        hint = "; `block` keeps two names apart before they meet"
        raise CurationError("not_found", f"{name_b!r} is not merged into {name_a!r}{hint}")
    if kind == "rename" and key_a != key_b and await conn.scalar(_ENTITY, {"k": key_b}):
        raise CurationError(
            "conflict",
            f"{name_b!r} names entities already: renaming {name_a!r} to it would merge them"
            " (make it a `merge` if that is meant)",
        )


def _check_rules(
    kind: str, *, name_a: str, key_a: str, name_b: str, key_b: str, rules: CurationRules
) -> None:
    if kind in REDIRECTS:
        if key_a == key_b:
            return  # a rename that keeps the key: the display name only
        if key_b in rules.redirects:
            raise CurationError(
                "conflict", f"{name_b!r} already resolves as {rules.target(key_b)!r}: undo that"
            )
        if rules.target(key_a) == key_b:
            raise CurationError("conflict", f"{name_a!r} resolves as {name_b!r}: a loop")
        after = CurationRules(rules.version, {**rules.redirects, key_b: key_a}, rules.blocks)
        if max(after.chain(k)[1] for k in after.redirects) >= MAX_REDIRECTS:
            raise CurationError(
                "conflict", f"a chain of {MAX_REDIRECTS} or more redirects would follow"
            )
        # Every name that would resolve as one entity, against every block.
        joined = {k for k in after.redirects if after.target(k) == after.target(key_a)}
        joined |= {after.target(key_a)}
        if any(rules.apart(x, y) for x in joined for y in joined):
            raise CurationError("conflict", f"a block keeps {name_a!r} and {name_b!r} apart")
    elif rules.target(key_a) == rules.target(key_b):
        raise CurationError("conflict", f"a rule joins {name_a!r} and {name_b!r}: undo it first")


async def undo(
    engine: AsyncEngine, curation_id: int, *, reason: str, by: str
) -> tuple[Curation, bool]:
    """Take a rule out of force; the apply resolves its documents again without it. Returns
    the curation and whether this call undid it (an undone one is returned as it is)."""
    async with engine.begin() as conn:
        await conn.execute(_LOCK)
        row = (
            await conn.execute(_UNDO, {"id": curation_id, "by": by, "reason": reason.strip()})
        ).one_or_none()
        if row is None:
            found = (await conn.execute(_ONE, {"id": curation_id})).one_or_none()
            if found is None:
                raise CurationError("not_found", f"no curation #{curation_id}")
            return _curation(found), False
        await conn.execute(_BUMP)
    return _curation(row), True


async def get(engine: AsyncEngine, curation_id: int) -> Curation:
    """One curation; CurationError not_found."""
    async with engine.connect() as conn:
        row = (await conn.execute(_ONE, {"id": curation_id})).one_or_none()
    if row is None:
        raise CurationError("not_found", f"no curation #{curation_id}")
    return _curation(row)


async def list_all(engine: AsyncEngine) -> list[Curation]:
    """Every curation, oldest first (undone ones too: the record is the audit trail)."""
    async with engine.connect() as conn:
        return [_curation(r) for r in (await conn.execute(_LIST)).all()]


def _curation(row: Any) -> Curation:
    return Curation(
        id=int(row.id),
        kind=row.kind,
        name_a=str(row.name_a),
        name_b=str(row.name_b),
        reason=str(row.reason),
        created_by=str(row.created_by),
        created_at=row.created_at,
        applied_at=row.applied_at,
        undone_by=row.undone_by,
        undone_at=row.undone_at,
        undo_reason=row.undo_reason,
        undo_applied_at=row.undo_applied_at,
    )


# --- the apply's bookkeeping (services/indexer/curation_apply.py) ---

_PENDING = text(
    "SELECT id, key_a, key_b, undone_at IS NOT NULL AS undone FROM curations"
    " WHERE applied_at IS NULL OR (undone_at IS NOT NULL AND undo_applied_at IS NULL)"
    " ORDER BY id"
)
# The documents whose resolution a rule on these keys can change: those that mention an entity
# of one of the keys, or name anything by one of them; added to the work not there yet.
_ADD_WORK = text(
    "INSERT INTO curation_work (doc_id, version)"
    " SELECT m.doc_id, :v FROM entities e JOIN mentions m ON m.entity_id = e.id"
    " WHERE e.key = ANY(:keys)"
    " UNION SELECT m.doc_id, :v FROM aliases a JOIN mentions m"
    "  ON m.entity_id = a.entity_id AND m.surface = a.alias WHERE a.alias_key = ANY(:keys)"
    " ON CONFLICT (doc_id) DO NOTHING"
)
_OTHER_VERSION = text("DELETE FROM curation_work WHERE version <> :v")
_TODO = text(
    "SELECT doc_id FROM curation_work WHERE state = 'todo' AND version = :v"
    " ORDER BY doc_id LIMIT :n"
)
_FAILED = text("SELECT doc_id FROM curation_work WHERE state = 'failed' ORDER BY doc_id")
_SETTLE = text("UPDATE curation_work SET state = :s WHERE doc_id = :d")
_CLEAR = text("DELETE FROM curation_work")
_APPLIED = text(
    "UPDATE curations SET applied_at = coalesce(applied_at, now()) WHERE id = ANY(:ids)"
)
_UNDO_APPLIED = text(
    "UPDATE curations SET undo_applied_at = now(), applied_at = coalesce(applied_at, now())"
    " WHERE id = ANY(:ids)"
)


@dataclass(frozen=True)
class Pending:
    """Rule changes whose documents are not resolved again yet."""

    made: Sequence[int]
    undone: Sequence[int]
    keys: Sequence[str]


async def pending(conn: AsyncConnection) -> Pending:
    """What the apply has to do."""
    made: list[int] = []
    undone: list[int] = []
    keys: set[str] = set()
    for r in (await conn.execute(_PENDING)).all():
        (undone if r.undone else made).append(int(r.id))
        keys |= {str(r.key_a), str(r.key_b)}
    return Pending(made, undone, sorted(keys))


async def add_work(conn: AsyncConnection, version: int, keys: Sequence[str]) -> int:
    """Queue the documents a rule on ``keys`` may resolve differently, for the rules of
    ``version`` (work left from other rules is dropped: it is started again under these).
    Returns how many were added."""
    await conn.execute(_OTHER_VERSION, {"v": version})
    if not keys:
        return 0
    return (await conn.execute(_ADD_WORK, {"v": version, "keys": list(keys)})).rowcount or 0


async def todo(conn: AsyncConnection, version: int, limit: int = 500) -> list[str]:
    """The next documents still to resolve again, in doc_id order."""
    return [str(r[0]) for r in (await conn.execute(_TODO, {"v": version, "n": limit})).all()]


async def failed_documents(conn: AsyncConnection) -> list[str]:
    """Documents whose extraction failed for good during this work."""
    return [str(r[0]) for r in (await conn.execute(_FAILED)).all()]


async def settle(conn: AsyncConnection, doc_id: str, state: str = "done") -> None:
    """Record a document's work as done (in the transaction that resolved it again) or
    failed."""
    await conn.execute(_SETTLE, {"d": doc_id, "s": state})


async def mark_applied(engine: AsyncEngine, done: Pending) -> None:
    """Record that ``done``'s documents were resolved again under the rules, and drop the
    work."""
    async with engine.begin() as conn:
        if done.made:
            await conn.execute(_APPLIED, {"ids": list(done.made)})
        if done.undone:
            await conn.execute(_UNDO_APPLIED, {"ids": list(done.undone)})
        await conn.execute(_CLEAR)
