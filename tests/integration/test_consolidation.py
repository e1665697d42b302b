"""Consolidation (issue 21, deliverable 1) on the real database: candidate pairs found with the
context gathered since ingest, an LLM adjudicator (the local OpenAI-compatible stub, over real
HTTP) deciding the band, its merges made as curations that the apply brings to the stored
documents, undone exactly and never proposed again; offline, nothing merged and the band written
out for a person to judge."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from services.core.curations import list_all, undo
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.llm.adjudicator import make_context_adjudicator
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.indexer.curation_apply import apply_pending
from services.maintenance.consolidation import consolidate
from tests.conftest import Infra
from tests.support.cli import kgstream
from tests.support.graph import create_database, drop_database, scalar, surface_entity
from tests.support.openai_stub import OpenAIStub, document_blocks
from tests.support.property_corpus import T0, Env

pytestmark = pytest.mark.integration


def _event(doc_id: str, title: str, text: str) -> dict[str, Any]:
    return {
        "event_id": doc_id,
        "type": "upsert",
        "doc_id": doc_id,
        "title": title,
        "text": text,
        "occurred_at": T0.isoformat(),
    }


# "Kings" shares a neighbour (Chris Webber) with "Sacramento Kings": the same team. "Germany"
# shares a document with "East Germany": another country. Both pairs are in the band.
KINGS_A = "The basketball team Sacramento Kings signed Chris Webber in 1998."
KINGS_B = "In 2002 the Kings and Chris Webber reached the conference finals."
EVENTS = [
    _event("kings-a", "Basketball", KINGS_A),
    _event("kings-b", "Playoffs", KINGS_B),
    _event("germany", "Reunification", "In 1990 East Germany joined Germany."),
]


def _answers_kings(asked: list[str]) -> Any:
    """The stub's model: the same entity only for the team's nickname."""

    def answer(body: dict[str, Any]) -> str:
        blocks = document_blocks(body["messages"][-1]["content"])
        short = blocks[0][1].split("\n", 1)[0]
        asked.append(short)
        return json.dumps({"same": short == "Kings"})

    return answer


async def test_adjudicated_merges_are_curations_undone_exactly_and_not_proposed_again(
    env: Env, openai_stub: OpenAIStub, embedder: OnnxMiniLmEmbedder
) -> None:
    url = create_database(env.server_url)
    engine = make_engine(url)
    asked: list[str] = []
    openai_stub.chat_handler = _answers_kings(asked)
    client = process_client(Settings(openai_base_url=openai_stub.base_url, llm_max_attempts=1))
    assert client is not None
    adjudicate = make_context_adjudicator(client, "stub-chat", attempts=1)
    try:
        await env.build(url, EVENTS)
        assert surface_entity(url, "kings-b", "Kings") == "Kings"
        changes_before = scalar(url, "SELECT count(*) FROM graph_changes")

        report = await consolidate(engine, embedder, adjudicate=adjudicate)
        decided = {(p.short, p.long): p.decision for p in report.pairs}
        assert decided[("Kings", "Sacramento Kings")] == "adjudicated"
        assert decided[("Germany", "East Germany")] == "declined"
        assert sorted(asked) == ["Germany", "Kings"]
        (rule,) = await list_all(engine)
        assert (rule.kind, rule.name_a, rule.name_b, rule.created_by) == (
            "merge",
            "Sacramento Kings",
            "Kings",
            "consolidation",
        )
        async with env.deps(url) as deps:
            await apply_pending(deps)
        assert surface_entity(url, "kings-b", "Kings") == "Sacramento Kings"
        assert surface_entity(url, "germany", "Germany") == "Germany"
        # the merge counts toward the change ratio like any event
        assert scalar(url, "SELECT count(*) FROM graph_changes") > changes_before

        await undo(engine, report.made[0], reason="not sure", by="test")
        async with env.deps(url) as deps:
            await apply_pending(deps)
        assert surface_entity(url, "kings-b", "Kings") == "Kings"
        again = await consolidate(engine, embedder, adjudicate=adjudicate)
        assert len(asked) == 2  # the answers are kept: nothing is asked twice
        assert {(p.short, p.long): p.decision for p in again.pairs}[
            ("Kings", "Sacramento Kings")
        ] == "ruled"
        assert again.made == []
    finally:
        await engine.dispose()
        drop_database(url)


def test_offline_consolidation_merges_nothing_and_writes_the_band_for_a_person(
    env: Env, infra: Infra, tmp_path: Path
) -> None:
    url = create_database(env.server_url)
    try:
        asyncio.run(env.build(url, EVENTS))
        on = Settings(home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap)
        band = tmp_path / "band.jsonl"
        ran = kgstream(on, "maintain", "consolidate", "--out", str(band), "--json")
        assert ran.returncode == 0, ran.stderr
        report = json.loads(ran.stdout)
        assert report["made"] == []
        uncertain = {
            (p["short"], p["long"]) for p in report["pairs"] if p["decision"] == "uncertain"
        }
        assert {("Kings", "Sacramento Kings"), ("Germany", "East Germany")} <= uncertain
        items = [json.loads(line) for line in band.read_text().splitlines()]
        judged = tmp_path / "judged.jsonl"
        judged.write_text(
            "".join(
                json.dumps({**i, "label": "same" if i["b"]["entity"] == "Kings" else "different"})
                + "\n"
                for i in items
            )
        )
        applied = kgstream(on, "review", "apply", str(judged), "--json")
        assert applied.returncode == 0, applied.stderr
        made = {(c["kind"], c["name"], c["other"]) for c in json.loads(applied.stdout)["curations"]}
        assert ("merge", "Sacramento Kings", "Kings") in made
        assert ("block", "East Germany", "Germany") in made
    finally:
        drop_database(url)
