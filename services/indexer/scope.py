"""Entity resolution's scope: a document resolves against the entities of its own tenant and
creates entities in it; the untenanted documents (tenant NULL) are a scope of their own.
Entities were once shared by every tenant, and one tenant's documents then steered another's
resolution: an alias its publisher gave, a key it used first, a trigram candidate, a wildcard
it narrowed, its counts in the tie-break (issue 30, finding 4). With ``entities.tenant``
(migration 0021) each statement of resolution says the scope with ``in_scope`` and binds the
tenant, so none of them can see another tenant's entities (or, through them, their aliases).

Curation rules are by name and apply within every tenant (docs/curation.md)."""

from __future__ import annotations


def in_scope(entity: str) -> str:
    """The SQL condition that the entity row ``entity`` (an alias in the statement) is in the
    document's scope; the statement binds ``:tenant`` (the document's tenant, or None)."""
    return f"{entity}.tenant IS NOT DISTINCT FROM CAST(:tenant AS text)"


def scoped_name(tenant: str | None, key: str) -> str:
    """A name key as the creation locks know it (graph_store/locks.py, rule 2): two tenants
    creating the same name do not wait for each other. Keys are normalised (no NUL)."""
    return key if tenant is None else f"{tenant}\x00{key}"
