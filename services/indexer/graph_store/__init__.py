"""The graph store: writes one event's write plan (services/indexer/write_plan.py) into
PostgreSQL in one transaction, and is the only writer of the graph's tables (documents' rows,
chunks, mentions, aliases, entities, relationships, evidence, graph_changes). Its lock-ordering
rules are stated once, in ``locks.py``; ``transaction.py`` runs an event's steps in that order.

Modules: ``transaction`` (one event's transaction), ``locks`` (the rules and every statement
that takes a lock), ``entities`` (resolution against the stored graph), ``chunks`` (a
document's chunks, mentions, aliases), ``relationships`` (edges and their evidence),
``rebuild`` (aggregates from the remaining evidence), ``changes`` (graph_changes, erasures),
``history`` (what a version replaces, kept for as_of reads)."""

from services.indexer.graph_store.transaction import write_delete, write_upsert

__all__ = ["write_delete", "write_upsert"]
