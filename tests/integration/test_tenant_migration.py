"""Migration 0021 (entities per tenant) on a graph that has them: its downgrade merges each
name's tenants' entities into one, as the indexer before it shared them, and its upgrade splits
them again into the graph the indexer builds per tenant, with the change logged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from alembic import command
from services.core.db.migrations import alembic_config
from tests.support.graph import (
    canonical_graph,
    create_database,
    drop_database,
    graph_diff,
    scalar,
    tenant_graph,
)
from tests.support.property_corpus import T0, Env

pytestmark = pytest.mark.integration

GATES = {"name": "Bill Gates", "type": "PERSON"}
MICROSOFT = {"name": "Microsoft", "type": "ORG", "aliases": ["MSFT"]}
FOUNDED = {"source": "Bill Gates", "target": "Microsoft", "type": "FOUNDED"}


def upsert(n: int, tenant: str | None, text: str) -> dict[str, Any]:
    """A v2 upsert of its own document (Bill Gates founded Microsoft), of ``tenant``."""
    event: dict[str, Any] = {
        "schema_version": 2,
        "event_id": f"e{n}",
        "type": "upsert",
        "doc_id": f"doc-{n}",
        "title": "Founders",
        "text": text,
        "occurred_at": T0.replace(microsecond=n).isoformat(),
        "entities": [GATES, MICROSOFT],
        "relationships": [FOUNDED],
    }
    return event if tenant is None else event | {"tenant": tenant}


def untimed(graph: dict[str, Any]) -> dict[str, Any]:
    """The graph with empty ``fact_times`` (as a downgrade past 0023 leaves it)."""
    return {**graph, "fact_times": []}


EVENTS = [
    upsert(1, "t1", "Bill Gates founded Microsoft."),
    upsert(2, "t2", "In 1975 Bill Gates founded Microsoft in Albuquerque."),
    upsert(3, None, "Microsoft later moved to Seattle."),
    upsert(4, "t1", "Microsoft hired Satya Nadella."),
]


def test_0021_splits_the_entities_tenants_shared_and_merges_them_back(env: Env) -> None:
    url = create_database(env.server_url)
    cfg = alembic_config(url, 384)
    try:
        loop = asyncio.new_event_loop()
        try:
            assert set(loop.run_until_complete(env.build(url, EVENTS))) == {"applied"}
        finally:
            loop.close()
        built = canonical_graph(url)
        scopes = {t: tenant_graph(url, t) for t in ("t1", "t2", None)}
        assert scalar(url, "SELECT count(*) FROM entities WHERE key = 'microsoft'") == 3

        command.downgrade(cfg, "0020")
        # One entity per name, as the indexer shared them: the scopes' counts summed, the
        # relationship's evidence of every scope on one row.
        assert scalar(url, "SELECT count(*) FROM entities WHERE key = 'microsoft'") == 1
        counts = sum(r[3] for r in built["entities"] if r[0] == "Microsoft")
        assert scalar(url, "SELECT mention_count FROM entities WHERE key = 'microsoft'") == counts
        assert scalar(url, "SELECT evidence_count FROM relationships WHERE type = 'FOUNDED'") == 4
        assert scalar(url, "SELECT count(*) FROM aliases WHERE alias = 'MSFT'") == 1

        command.upgrade(cfg, "head")
        # Going down to 0020 dropped fact_times (0023), and going up made it again, empty: the
        # times come back with a rebuild (docs/retrieval.md, "Time-scoped facts").
        assert built["fact_times"]
        assert not scalar(url, "SELECT count(*) FROM fact_times")
        after = untimed(canonical_graph(url))
        assert after == untimed(built), graph_diff(after, untimed(built))
        for tenant, graph in scopes.items():
            assert untimed(tenant_graph(url, tenant)) == untimed(graph), tenant
        assert (
            scalar(
                url,
                "SELECT count(*) FROM mentions m JOIN documents d ON d.doc_id = m.doc_id"
                " JOIN entities e ON e.id = m.entity_id WHERE e.tenant IS DISTINCT FROM d.tenant",
            )
            == 0
        )
        logged = scalar(url, "SELECT count(*) FROM graph_changes WHERE event_id = 'migration:0021'")
        assert logged > 0  # the communities see the split
    finally:
        drop_database(url)
