"""Curations against a real database and the real offline models: a rule reaches the stored
documents (the apply), holds at every later ingest (re-upserts, replays), undoes exactly, and the
graph it leaves equals a rebuild of the surviving documents under the same rules."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from services.core.access import Caller
from services.core.api_keys import create_key
from services.core.curations import CurationError, create, list_all, undo
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.indexer.curation_apply import APPLIER_LOCK, apply_pending
from services.indexer.handlers import prepare_batch, write_batch
from services.retrieval import graph_memory, neighbourhood
from services.retrieval.graph_walk import MemoryGraphReads
from tests.conftest import Infra
from tests.integration import test_graph_properties as props
from tests.integration.test_graph_properties import Step
from tests.support.api_client import api_client
from tests.support.cli import kgstream
from tests.support.graph import (
    apply_events,
    canonical_graph,
    create_database,
    drop_database,
    graph_diff,
    scalar,
    surface_entity,
    to_record,
)
from tests.support.property_corpus import DOC_IDS, T0, Env

pytestmark = pytest.mark.integration

BY = "test"


_ids = iter(range(1, 1_000_000))


def doc(doc_id: str, title: str, *sentences: str) -> dict[str, Any]:
    """An upsert, newer than every event made before it."""
    n = next(_ids)
    return {
        "event_id": f"{doc_id}-{n}",
        "type": "upsert",
        "doc_id": doc_id,
        "title": title,
        "text": " ".join(sentences),
        "occurred_at": T0.replace(microsecond=n).isoformat(),
    }


# "Mao" and "Mao Zedong" in documents of their own stay two entities; in one document the
# short form is read as the long name's, and its alias carries "Mao" of other documents there.
ZEDONG = doc("doc-zedong", "Chinese Revolution", "The leader Mao Zedong founded the state.")
NIXON = doc("doc-nixon", "Diplomacy", "In 1972 Mao met Richard Nixon in Beijing.")
BOTH = doc(
    "doc-both",
    "Long March",
    "The leader Mao Zedong led the march.",
    "In 1949 Mao proclaimed the new state.",
)


def entity_names(url: str) -> list[str]:
    rows = scalar(url, "SELECT array_agg(name ORDER BY name) FROM entities")
    return list(rows or [])


async def ingest(env: Env, url: str, events: Sequence[dict[str, Any]]) -> None:
    outcomes = await env.build(url, events)
    assert set(outcomes) <= {"applied", "unchanged"}, outcomes


async def apply(env: Env, url: str) -> None:
    async with env.deps(url) as deps:
        report = await apply_pending(deps)
    assert not report.busy
    assert not report.failed


async def rule(url: str, kind: str, a: str, b: str, **kw: Any) -> int:
    engine = make_engine(url)
    try:
        return (await create(engine, kind, a, b, reason="test", by=BY, **kw))[0].id
    finally:
        await engine.dispose()


async def rebuilt_with_rules(
    env: Env, rules: Sequence[tuple[str, str, str]], events: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The graph of ``events`` ingested into a fresh database that has ``rules`` from the
    start (as `kgstream curate import` carries them into a rebuild)."""
    url = create_database(env.server_url)
    try:
        for kind, a, b in rules:
            await rule(url, kind, a, b, against_graph=False)
        await ingest(env, url, [dict(e, event_id=f"re-{e['event_id']}") for e in events])
        return canonical_graph(url)
    finally:
        drop_database(url)


async def test_a_merge_reaches_stored_documents_survives_reupserts_and_equals_a_rebuild(
    env: Env,
) -> None:
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [ZEDONG, NIXON])
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao"  # two entities
        await rule(url, "merge", "Mao Zedong", "Mao")
        await apply(env, url)
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao Zedong"
        assert "Mao" not in entity_names(url)
        # Both documents again, changed: the rule holds at ingest, not by a one-off edit.
        zedong2 = doc("doc-zedong", "Chinese Revolution", "Mao Zedong founded the state in 1949.")
        nixon2 = doc(
            "doc-nixon",
            "Diplomacy",
            "In 1972 Mao met Richard Nixon in Beijing.",
            "Nixon later wrote about Mao.",
        )
        await ingest(env, url, [zedong2, nixon2])
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao Zedong"
        got = canonical_graph(url)
        want = await rebuilt_with_rules(env, [("merge", "Mao Zedong", "Mao")], [zedong2, nixon2])
        assert got == want, graph_diff(got, want)
        statuses = [c.status for c in await _list(url)]
        assert statuses == ["applied"]
    finally:
        drop_database(url)


async def test_a_rule_applies_within_every_tenant(env: Env) -> None:
    """Rules are by name and apply in every tenant, each tenant's "Mao" to its own "Mao
    Zedong" (entities are per tenant: docs/curation.md, "Curations and tenants"); the untenanted
    documents have only "Mao", which the rule leaves its own."""
    events = [
        dict(e, doc_id=f"{t}/{e['doc_id']}", event_id=f"{t}/{e['event_id']}", tenant=t)
        for t in ("t1", "t2")
        for e in (ZEDONG, NIXON)
    ] + [dict(NIXON, doc_id="none/doc-nixon", event_id="none/nixon")]
    url = create_database(env.server_url)
    try:
        await ingest(env, url, events)
        await rule(url, "merge", "Mao Zedong", "Mao")
        await apply(env, url)
        for t in ("t1", "t2"):
            named = scalar(
                url,
                "SELECT array_agg(DISTINCT o.doc_id ORDER BY o.doc_id) FROM mentions m"
                " JOIN mentions o ON o.entity_id = m.entity_id"
                " WHERE m.doc_id = :d AND m.surface = 'Mao'",
                d=f"{t}/doc-nixon",
            )
            assert named == [f"{t}/doc-nixon", f"{t}/doc-zedong"]
        assert surface_entity(url, "none/doc-nixon", "Mao") == "Mao"
        got = canonical_graph(url)
        want = await rebuilt_with_rules(env, [("merge", "Mao Zedong", "Mao")], events)
        assert got == want, graph_diff(got, want)
    finally:
        drop_database(url)


async def test_a_block_undoes_the_automatic_merge_and_keeps_it_from_coming_back(
    env: Env,
) -> None:
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [BOTH, NIXON])
        # Without a rule: the short form joins the long name, here and, by alias, elsewhere.
        assert surface_entity(url, "doc-both", "Mao") == "Mao Zedong"
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao Zedong"
        await rule(url, "split", "Mao Zedong", "Mao")
        await apply(env, url)
        assert surface_entity(url, "doc-both", "Mao") == "Mao"
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao"
        replay = dict(BOTH, event_id="replayed-both", occurred_at=T0.replace(year=2025).isoformat())
        await ingest(env, url, [replay])
        assert surface_entity(url, "doc-both", "Mao") == "Mao"
        got = canonical_graph(url)
        want = await rebuilt_with_rules(env, [("block", "Mao Zedong", "Mao")], [replay, NIXON])
        assert got == want, graph_diff(got, want)
    finally:
        drop_database(url)


@pytest.mark.parametrize(
    ("kind", "a", "b"),
    [
        ("merge", "Mao Zedong", "Mao"),
        ("split", "Mao Zedong", "Mao"),
        ("rename", "Richard Nixon", "Richard Milhous Nixon"),
        ("alias", "Mao Zedong", "Mao"),
    ],
)
async def test_undo_restores_the_graph_exactly(env: Env, kind: str, a: str, b: str) -> None:
    url = create_database(env.server_url)
    events = [BOTH, NIXON] if kind == "split" else [ZEDONG, NIXON]
    try:
        await ingest(env, url, events)
        before = canonical_graph(url)
        curation = await rule(url, kind, a, b)
        await apply(env, url)
        during = canonical_graph(url)
        assert during != before
        engine = make_engine(url)
        try:
            await undo(engine, curation, reason="wrong", by=BY)
        finally:
            await engine.dispose()
        await apply(env, url)
        after = canonical_graph(url)
        assert after == before, graph_diff(after, before)
        (row,) = await _list(url)
        assert (row.status, row.undone_by, row.undo_reason) == ("undone", BY, "wrong")
    finally:
        drop_database(url)


async def test_rename_names_the_entity_and_its_new_name_resolves_to_it(env: Env) -> None:
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [NIXON])
        await rule(url, "rename", "Richard Nixon", "Richard Milhous Nixon")
        await apply(env, url)
        assert "Richard Milhous Nixon" in entity_names(url)
        assert "Richard Nixon" not in entity_names(url)
        later = doc("doc-later", "Watergate", "In 1974 Richard Milhous Nixon resigned.")
        await ingest(env, url, [later])
        assert surface_entity(url, "doc-later", "Richard Milhous Nixon") == "Richard Milhous Nixon"
        assert surface_entity(url, "doc-nixon", "Richard Nixon") == "Richard Milhous Nixon"
    finally:
        drop_database(url)


async def test_an_event_planned_before_a_curation_is_planned_again_under_it(env: Env) -> None:
    """The race: an event computed under the old rules must not commit after a rule change
    (the apply may have run already and would not see it)."""
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [ZEDONG])
        async with env.deps(url) as deps:
            prepared = await prepare_batch(deps, [to_record(NIXON)])
            await rule(url, "alias", "Mao Zedong", "Mao")
            await apply(env, url)
            assert await write_batch(deps, prepared) == ["applied"]
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao Zedong"
    finally:
        drop_database(url)


async def test_rules_that_cannot_be_made_say_why(env: Env) -> None:
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [ZEDONG, NIXON])
        cases: list[tuple[tuple[str, str, str], str, str]] = [
            (("merge", "Mao Zedong", "Zhou Enlai"), "not_found", "no entity is named 'Zhou Enlai'"),
            (("split", "Mao Zedong", "Mao"), "not_found", "is not merged into"),
            (("merge", "Mao", "MAO"), "invalid", "one name to resolution"),
            (("block", "Mao", "  "), "invalid", "empty"),
            (("fuse", "Mao", "Nixon"), "invalid", "kind must be one of"),
        ]
        for (kind, a, b), code, message in cases:
            with pytest.raises(CurationError) as err:
                await rule(url, kind, a, b)
            assert err.value.code == code
            assert message in err.value.detail
        await rule(url, "merge", "Mao Zedong", "Mao")
        for (kind, a, b), message in [
            (("block", "Mao", "Mao Zedong"), "a rule joins"),
            (("alias", "Mao", "Mao Zedong"), "a loop"),
            (("alias", "Richard Nixon", "Mao"), "already resolves as"),
        ]:
            with pytest.raises(CurationError) as err:
                await rule(url, kind, a, b)
            assert err.value.code == "conflict"
            assert message in err.value.detail
    finally:
        drop_database(url)


async def test_a_second_applier_waits_its_turn(env: Env) -> None:
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [ZEDONG, NIXON])
        await rule(url, "merge", "Mao Zedong", "Mao")
        engine = make_engine(url)
        try:
            async with engine.connect() as conn:
                assert await conn.scalar(_LOCK)
                async with env.deps(url) as deps:
                    assert (await apply_pending(deps)).busy
                await conn.execute(_UNLOCK)
        finally:
            await engine.dispose()
        assert [c.status for c in await _list(url)] == ["pending"]
        await apply(env, url)
        assert [c.status for c in await _list(url)] == ["applied"]
    finally:
        drop_database(url)


async def _list(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        return await list_all(engine)
    finally:
        await engine.dispose()


_LOCK = text(f"SELECT pg_try_advisory_lock({APPLIER_LOCK})")
_UNLOCK = text(f"SELECT pg_advisory_unlock({APPLIER_LOCK})")


# --- the property: events, curations and undos in any order equal a rebuild under the rules ---

# Rules over the property corpus' names (tests/support/property_corpus.py): merges across
# documents and types, a rename that keeps its key and one that adds a name, a block, an alias.
RULES: list[tuple[str, str, str]] = [
    ("merge", "Bill Gates", "Paul Allen"),
    ("merge", "London", "Paris"),
    ("merge", "Microsoft", "Seattle"),
    ("block", "Angela Merkel", "Olaf Scholz"),
    ("rename", "Germany", "Federal Republic of Germany"),
    ("rename", "Toyota", "TOYOTA"),
    ("alias", "Satya Nadella", "Steve Ballmer"),
]


@dataclass(frozen=True)
class Act:
    """One step: a document event (props.Step) or a curation (rule index, or undo of the n-th
    curation made so far), applied now or left pending."""

    step: Step | None
    rule: int
    undo: bool
    apply_now: bool


@st.composite
def acts(draw: st.DrawFn) -> list[Act]:
    steps = draw(props.scenarios())
    out = [Act(s, 0, False, False) for s in steps]
    for _ in range(draw(st.integers(1, 5))):
        at = draw(st.integers(0, len(out)))
        out.insert(
            at,
            Act(
                None,
                draw(st.integers(0, len(RULES) - 1)),
                draw(st.booleans()),
                draw(st.booleans()),
            ),
        )
    return out


@dataclass
class Held:
    """The in-memory walked graph (services/retrieval/graph_memory.py) followed through the
    acts: refreshed after each applied curation and at the end, and a fresh build then."""

    state: graph_memory.MemoryGraph | None = None
    fresh: graph_memory.MemoryGraph | None = None


async def _run_acts(
    env: Env, url: str, todo: Sequence[Act], held: Held | None = None
) -> tuple[props.Planner, list[int]]:
    """Apply ``todo`` to ``url``; the planner of its events and the rules left in force."""
    planner = props.Planner()
    made: list[int] = []  # indexes into RULES of the curations made, in order
    ids: list[int] = []
    undone: set[int] = set()
    engine = make_engine(url)
    held = held or Held()
    try:
        held.state = await graph_memory.build(engine)
        async with env.deps(url) as deps:
            for act in todo:
                if act.step is not None:
                    before = len(planner.sent)
                    planner.add(act.step)
                    await apply_events(deps, planner.sent[before:])
                    continue
                if act.undo and ids:
                    pick = act.rule % len(ids)
                    await undo(engine, ids[pick], reason="", by=BY)
                    undone.add(pick)
                elif not act.undo:
                    kind, a, b = RULES[act.rule]
                    with suppress(CurationError):  # a name not ingested yet, a conflict
                        got, new = await create(engine, kind, a, b, reason="", by=BY)
                        if new:
                            ids.append(got.id)
                            made.append(act.rule)
                if act.apply_now:
                    await apply_pending(deps)
                    held.state = await graph_memory.refresh(engine, held.state)
            await apply_pending(deps)
        held.state = await graph_memory.refresh(engine, held.state)
        held.fresh = await graph_memory.build(engine)
    finally:
        await engine.dispose()
    return planner, [r for i, r in enumerate(made) if i not in undone]


@settings(max_examples=int(os.environ.get("KGSTREAM_PROPERTY_EXAMPLES", "12")), deadline=None)
@given(todo=acts(), order=st.permutations(DOC_IDS))
def test_events_curations_and_undos_equal_a_rebuild_under_the_rules(
    env: Env, todo: list[Act], order: list[str]
) -> None:
    incremental, rebuilt = create_database(env.server_url), create_database(env.server_url)
    try:
        loop = asyncio.new_event_loop()
        try:
            held = Held()
            planner, in_force = loop.run_until_complete(_run_acts(env, incremental, todo, held))
            latest = [planner.docs[d].current for d in order if planner.docs[d].live_text]
            survivors = [dict(e, event_id=f"re-{e['event_id']}") for e in latest if e]

            async def rebuild() -> None:
                engine = make_engine(rebuilt)
                try:
                    for r in in_force:
                        kind, a, b = RULES[r]
                        await create(engine, kind, a, b, reason="", by=BY, against_graph=False)
                finally:
                    await engine.dispose()
                await env.build(rebuilt, survivors)

            loop.run_until_complete(rebuild())
        finally:
            loop.close()
        got, want = canonical_graph(incremental), canonical_graph(rebuilt)
        assert got == want, graph_diff(got, want)
        # The graph a query process holds, kept current through the same curations.
        assert held.state is not None
        assert held.fresh is not None
        assert held.state.canonical() == held.fresh.canonical()
        statuses = scalar(incremental, "SELECT count(*) FROM curations WHERE applied_at IS NULL")
        assert statuses == 0
    finally:
        drop_database(incremental)
        drop_database(rebuilt)


# --- `kgstream curate` as an operator runs it ---


def test_curate_cli_makes_lists_applies_undoes_exports_and_imports(
    env: Env, infra: Infra, tmp_path: Path
) -> None:
    url, target = create_database(env.server_url), create_database(env.server_url)
    try:
        asyncio.run(ingest(env, url, [ZEDONG, NIXON]))
        on = Settings(home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap)

        made = kgstream(on, "curate", "merge", "Mao Zedong", "Mao", "--reason", "one person")
        assert made.returncode == 0, made.stderr
        assert "#1 merge 'Mao Zedong' <- 'Mao' [pending] by cli" in made.stdout
        listed = json.loads(kgstream(on, "curate", "list", "--json").stdout)
        assert [(c["kind"], c["name"], c["other"], c["status"], c["reason"]) for c in listed] == [
            ("merge", "Mao Zedong", "Mao", "pending", "one person")
        ]
        assert listed[0]["created_by"].startswith("cli")

        applied = kgstream(on, "curate", "apply", "--json")
        assert applied.returncode == 0, applied.stderr
        report = json.loads(applied.stdout)
        assert (report["curations"], report["documents"], report["failed"]) == (1, 2, [])
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao Zedong"

        refused = kgstream(on, "curate", "merge", "Mao Zedong", "Zhou Enlai")
        assert refused.returncode == 2
        assert "error: no entity is named 'Zhou Enlai'" in refused.stderr

        exported = tmp_path / "rules.jsonl"
        assert kgstream(on, "curate", "export", "--out", str(exported)).returncode == 0
        into = Settings(
            home=infra.home, database_url=target, kafka_bootstrap_servers=infra.bootstrap
        )
        imported = kgstream(into, "curate", "import", str(exported))
        assert imported.returncode == 0, imported.stderr
        (carried,) = json.loads(kgstream(into, "curate", "list", "--json").stdout)
        assert (carried["kind"], carried["name"], carried["other"]) == (
            "merge",
            "Mao Zedong",
            "Mao",
        )

        undone = kgstream(on, "curate", "undo", "1", "--reason", "two people", "--apply")
        assert undone.returncode == 0, undone.stderr
        assert "applied 1 rule change(s): 2 document(s) resolved again" in undone.stdout
        assert surface_entity(url, "doc-nixon", "Mao") == "Mao"
        again = kgstream(on, "curate", "undo", "1")
        assert again.returncode == 0, again.stderr
        assert "(undone already: nothing changed)" in again.stdout
        twice = kgstream(on, "curate", "block", "Mao", "Mao Zedong")
        assert twice.returncode == 0, twice.stderr
        same = kgstream(on, "curate", "block", "Mao Zedong", "Mao")
        assert "(already in force: nothing made)" in same.stdout
    finally:
        drop_database(url)
        drop_database(target)


# --- /v1/curations, as an application with an admin key calls it ---


async def test_curations_api_records_the_key_and_answers_problems(
    env: Env,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    url = create_database(env.server_url)
    engine = make_engine(url)
    try:
        await ingest(env, url, [ZEDONG, NIXON])
        row, key = await create_key(engine, ["admin"], name="ops")
        models = (embedder, extractor, cpu_pool)
        headers = {"Authorization": f"Bearer {key}"}
        async with api_client(infra, url, engine, models, headers) as client:
            body = {"kind": "merge", "name": "Mao Zedong", "other": "Mao", "reason": "one man"}
            made = await client.post("/v1/curations", json=body)
            assert made.status_code == 201, made.text
            rule = made.json()
            assert (rule["status"], rule["created_by"]) == ("pending", f"key:{row.id} (ops)")
            assert (await client.post("/v1/curations", json=body)).status_code == 200

            for bad, status, words in [
                ({**body, "other": "Zhou Enlai"}, 404, "no entity is named 'Zhou Enlai'"),
                ({**body, "kind": "block"}, 409, "a rule joins"),
                ({**body, "kind": "fuse"}, 422, "kind"),
                ({**body, "other": "Mao\nZedong"}, 422, "control characters"),
            ]:
                refused = await client.post("/v1/curations", json=bad)
                assert refused.status_code == status, refused.text
                assert refused.headers["content-type"] == "application/problem+json"
                assert words in refused.text
            assert (await client.get("/v1/curations/999")).status_code == 404
            waiting = (await client.get("/v1/status")).json()["curations"]
            assert (waiting["in_force"], waiting["pending"]) == (1, 1)
            assert waiting["oldest_pending_s"] >= 0

            async with env.deps(url) as deps:  # the indexer's tick
                await apply_pending(deps)
            done = (await client.get("/v1/status")).json()["curations"]
            assert done == {"in_force": 1, "pending": 0, "oldest_pending_s": None}
            assert surface_entity(url, "doc-nixon", "Mao") == "Mao Zedong"
            one = (await client.get(f"/v1/curations/{rule['id']}")).json()
            assert one["status"] == "applied"

            undone = await client.post(f"/v1/curations/{rule['id']}/undo", json={"reason": "no"})
            assert undone.status_code == 200, undone.text
            assert (undone.json()["status"], undone.json()["undone_by"]) == (
                "undoing",
                f"key:{row.id} (ops)",
            )
            async with env.deps(url) as deps:
                await apply_pending(deps)
            listed = (await client.get("/v1/curations")).json()["curations"]
            assert [(c["id"], c["status"]) for c in listed] == [(rule["id"], "undone")]
            assert surface_entity(url, "doc-nixon", "Mao") == "Mao"
    finally:
        await engine.dispose()
        drop_database(url)


def test_review_apply_turns_verdicts_into_curations(env: Env, infra: Infra, tmp_path: Path) -> None:
    url = create_database(env.server_url)
    try:
        asyncio.run(ingest(env, url, [ZEDONG, NIXON]))
        on = Settings(home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap)

        def side(doc_id: str, surface: str) -> dict[str, Any]:
            return {"contexts": [{"doc_id": doc_id, "surface": surface}]}

        judged = tmp_path / "week.jsonl"
        items = [
            ("candidate", side("doc-zedong", "Mao Zedong"), side("doc-nixon", "Mao"), "same"),
            ("candidate", side("doc-nixon", "Richard Nixon"), side("doc-nixon", "Beijing"),
             "different"),
            ("candidate", side("doc-nixon", "Beijing"), side("doc-zedong", "Mao Zedong"),
             "unsure"),
        ]  # fmt: skip
        judged.write_text(
            "".join(
                json.dumps({"kind": k, "a": a, "b": b, "label": label}) + "\n"
                for k, a, b, label in items
            )
        )
        dry = kgstream(on, "review", "apply", str(judged), "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        report = json.loads(dry.stdout)
        # the graph keeps the pair judged the same apart: one decision of two is right
        assert report["figures"]["linking_accuracy"]["hits"] == 1
        assert report["figures"]["linking_accuracy"]["of"] == 2
        assert [(c["kind"], c["name"], c["other"]) for c in report["curations"]] == [
            ("merge", "Mao Zedong", "Mao"),
            ("block", "Richard Nixon", "Beijing"),
            (None, "", ""),
        ]
        assert json.loads(kgstream(on, "curate", "list", "--json").stdout) == []

        made = kgstream(on, "review", "apply", str(judged))
        assert made.returncode == 0, made.stderr
        assert "line 1: merge 'Mao Zedong' / 'Mao': made #1" in made.stdout
        listed = json.loads(kgstream(on, "curate", "list", "--json").stdout)
        assert [(c["kind"], c["reason"]) for c in listed] == [
            ("merge", "review week.jsonl:1"),
            ("block", "review week.jsonl:2"),
        ]
    finally:
        drop_database(url)


# --- pruning: weak relationships marked, never deleted ---


async def test_a_weak_edge_turns_strong_with_evidence_and_weak_again_when_it_goes(
    env: Env,
) -> None:
    url = create_database(env.server_url)
    weak = (
        "SELECT r.weak FROM relationships r JOIN entities s ON s.id = r.source_id"
        " JOIN entities t ON t.id = r.target_id WHERE r.type = 'co_occurs'"
        " AND least(s.name, t.name) = 'Beijing' AND greatest(s.name, t.name) = 'Richard Nixon'"
    )
    try:
        await ingest(env, url, [NIXON])
        assert scalar(url, weak) is True  # one sentence says it
        again = doc("doc-again", "Visit", "In 1972 Richard Nixon flew to Beijing.")
        await ingest(env, url, [again])
        assert scalar(url, weak) is False  # a second piece of evidence
        gone = {"event_id": "gone", "type": "delete", "doc_id": "doc-again",
                "occurred_at": T0.replace(year=2030).isoformat()}  # fmt: skip
        assert await env.build(url, [gone]) == ["deleted"]
        assert scalar(url, weak) is True  # and back, with the edge still there

        async with env.deps(url) as deps, deps.engine.connect() as conn:
            seeds = [int(scalar(url, "SELECT id FROM entities WHERE name = 'Richard Nixon'"))]
            held = await graph_memory.build(deps.engine)
            for reads in (
                neighbourhood.DbGraphReads(conn, Caller.operator()),
                MemoryGraphReads(held, conn),
            ):
                every = await neighbourhood.around(reads, seeds)
                strong = await neighbourhood.around(reads, seeds, hide_weak=True)
                assert every.relations
                assert strong.relations == []  # each edge here is a single co-occurrence
    finally:
        drop_database(url)


async def test_rules_that_would_void_a_block_loop_or_merge_by_rename_are_refused(
    env: Env,
) -> None:
    url = create_database(env.server_url)
    try:
        await ingest(env, url, [ZEDONG, NIXON])
        await rule(url, "alias", "Mao Zedong", "Chairman Mao")
        await rule(url, "block", "Chairman Mao", "Mao", against_graph=False)
        for (kind, a, b), message in [
            # Mao would resolve as Mao Zedong, as Chairman Mao does: the block would be void
            (("merge", "Mao Zedong", "Mao"), "a block keeps"),
            # renaming onto a name other entities have would merge them
            (("rename", "Mao Zedong", "Richard Nixon"), "names entities already"),
        ]:
            with pytest.raises(CurationError) as err:
                await rule(url, kind, a, b)
            assert err.value.code == "conflict"
            assert message in err.value.detail
        for i in range(1, 8):  # a chain k1 -> k0, k2 -> k1, ... of 7 redirects is allowed
            await rule(url, "alias", f"Name{i - 1}", f"Name{i}", against_graph=False)
        with pytest.raises(CurationError) as err:
            await rule(url, "alias", "Name7", "Name8", against_graph=False)
        assert "a chain of 8 or more redirects" in err.value.detail
    finally:
        drop_database(url)
