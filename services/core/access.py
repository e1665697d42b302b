"""Who is asking, and what they may see. A document is visible to a caller when the caller is
an admin, or when the document belongs to the caller's tenant (both unset counts as the same
tenant) and its ACL is absent or shares a group with the caller. An empty ACL list is visible
to admins only. Everything derived from documents (chunks, entities, relationships, evidence,
paths, community summaries) is visible only through documents the caller can see."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from services.core.doc_scope import DocScope


@dataclass(frozen=True)
class Caller:
    """The identity a request runs as: from an API key, or the operator's own access."""

    tenant: str | None = None
    groups: frozenset[str] = field(default_factory=frozenset)
    admin: bool = False
    key_id: int | None = None
    # Set per read transaction (services/retrieval/visibility.widened), never from a key: every
    # live document is visible to this caller in the transaction's snapshot, so its reads need
    # no per-row visibility filter. It grants nothing an admin key grants (writes, status).
    whole_corpus: bool = False
    # Set per query from its filters (services/retrieval/filters.py): the reads see only the
    # visible documents in this scope. Narrows, never widens; the ACL rule above is unchanged.
    scope: DocScope | None = None

    @classmethod
    def operator(cls) -> Caller:
        """Direct database access (CLI, eval): sees everything, like an admin key."""
        return cls(admin=True)

    @property
    def unfiltered(self) -> bool:
        """Reads run without a per-document filter: an admin or a whole-corpus caller, with
        no document scope."""
        return (self.admin or self.whole_corpus) and self.scope is None

    def can_see(self, tenant: str | None, acl: Collection[str] | None) -> bool:
        """The visibility rule for one document (the SQL filters implement the same rule)."""
        if self.admin:
            return True
        if tenant != self.tenant:
            return False
        return acl is None or not self.groups.isdisjoint(acl)
