"""Incremental cost through the LLM path (issue 10, deliverable 3): what a small and a 10% change
cost against the full build, in LLM calls, embedding inputs, prompt tokens and wall time.

    .venv/bin/python bench/bench_incremental.py [--events PATH] [--quick] [--seed 11]
        [--out report.json]

Everything model-shaped goes to tests/support/openai_stub.py, a real OpenAI-compatible HTTP
server started here (extraction, entity-merge adjudication and community reports by chat
completion; embeddings of chunks, entity names and reports); the stub's request log is the
counter. An embedded PostgreSQL and tansu broker and one real `kgstream worker indexer` process
configured for the LLM path (bench/_scale_harness.py); the communities engine runs in this
process with LLM report summaries, as the communities worker would.

Phases (wall time = publish -> all applied, plus the community work):
- full build: every event, then a recompute (every community gets an LLM report);
- (a) 1% of the documents edited (new version, text edited) and 1% deleted, then the check the
  scheduler runs (services/communities/worker.tick, policy threshold from the settings; the
  minimum interval set to 0 so only the change ratio decides); stale reports counted
  (bench/_stale_reports.py). Then (a+) what the max-staleness recompute would later cost;
- (b) 10% of the other documents edited, then the same check: past the threshold it
  re-clusters and refreshes every community whose fingerprint (members, descriptions, internal
  relationships) is new. (Should the change stay under the threshold, the max-staleness
  recompute that follows is counted in (b), and the JSON says so.)
``--quick`` takes the first 100 events. Prints tables to stderr and JSON to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import Stack, indexer_stack, processed, wait_for  # noqa: E402
from _stale_reports import staleness  # noqa: E402
from incremental_cost import (  # noqa: E402
    Tally,
    chat_kind,
    choose,
    delete_event,
    edited_event,
    phase_rows,
    render,
    report_answer,
    summary_levels,
    tally,
)
from sqlalchemy import text  # noqa: E402

from services.communities.app import build_deps  # noqa: E402
from services.communities.policy import Policy  # noqa: E402
from services.communities.recompute import RecomputeDeps  # noqa: E402
from services.communities.worker import run_now, tick  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from tests.support.openai_stub import OpenAIStub, extract_graph  # noqa: E402

DEFAULT_EVENTS = Path("/work/shared/data/hotpotqa-train100/events_full.jsonl")
QUICK = 100
MODEL, EMBEDDING_MODEL = "stub-llm", "stub-embedding"
TARGETS_A = {"llm_calls": 0.02, "embedding_inputs": 0.02, "wall_s": 0.05}
TARGETS_B = {"llm_calls": 0.25}
# GraphRAG 3.3.0 `graphrag update`, measured on this machine class (the figures).
GRAPHRAG = {
    "a": "1% addition: 1.6% of its chat calls, re-embeds 80% of all texts, 38 old reports stale",
    "b": "10% addition: re-embeds 97% of all texts, never re-clusters old communities",
}


def answer(body: dict[str, Any]) -> str:
    """The stub's chat answers: reports and adjudications by kind, else its extraction."""
    kind = chat_kind(body)
    if kind == "summary":
        return report_answer(body)
    if kind == "adjudication":
        return json.dumps({"same": False})
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    if len(users) != 1:  # gleaning turns: nothing more
        return json.dumps({"entities": [], "relationships": []})
    return json.dumps(extract_graph(str(users[0].get("content", ""))))


class Meter:
    """Counts the stub's requests since the last mark."""

    def __init__(self, stub: OpenAIStub) -> None:
        self.stub = stub
        self.mark = 0

    def take(self) -> Tally:
        """The tally of the requests since the last ``take`` (and move the mark)."""
        with self.stub._lock:
            requests = self.stub.requests[self.mark :]
            self.mark += len(requests)
        return tally((r.path, r.body) for r in requests)


def measures(counts: Tally, wall_s: float) -> dict[str, float]:
    """The figures a phase is compared on."""
    return {
        "llm_calls": counts.llm_calls(),
        "extraction_calls": counts.calls.get("extraction", 0) + counts.calls.get("gleaning", 0),
        "adjudication_calls": counts.calls.get("adjudication", 0),
        "summary_calls": counts.calls.get("summary", 0),
        "embedding_inputs": counts.inputs.get("embedding", 0),
        "llm_prompt_tokens": sum(n for k, n in counts.prompt_tokens.items() if k != "embedding"),
        "embedding_tokens": counts.prompt_tokens.get("embedding", 0),
        "wall_s": round(wall_s, 2),
    }


def merge(*tallies: Tally) -> Tally:
    out = Tally()
    for t in tallies:
        for kind, n in t.calls.items():
            out.calls[kind] = out.calls.get(kind, 0) + n
            out.inputs[kind] = out.inputs.get(kind, 0) + t.inputs.get(kind, 0)
            out.prompt_tokens[kind] = out.prompt_tokens.get(kind, 0) + t.prompt_tokens.get(kind, 0)
    return out


def ingest(stack: Stack, events: list[dict[str, Any]]) -> float:
    """Publish ``events`` and wait until all are applied; seconds taken."""
    before = processed(stack.url)
    t0 = time.perf_counter()
    stack.publish(events)
    done = wait_for(stack.url, before + len(events), 3 * 3600)
    return done - t0


async def scalar(deps: RecomputeDeps, sql: str, **params: Any) -> Any:
    async with deps.engine.connect() as conn:
        return await conn.scalar(text(sql), params)


async def refreshed(deps: RecomputeDeps, old: int, new: int, prompts: set[str]) -> dict[str, Any]:
    """Of the new snapshot's communities whose fingerprint the old one did not have: how many
    got a report written by this phase's summary calls (the stub's report summary is the first
    line of its prompt, which names the community, its level and size), and how many of them
    have a member set the old snapshot did not have."""
    async with deps.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT n.summary, coalesce(n.report->>'writer', '') AS writer"
                    " FROM communities n WHERE n.snapshot_id = :new AND NOT EXISTS"
                    " (SELECT 1 FROM communities o WHERE o.snapshot_id = :old"
                    " AND o.fingerprint = n.fingerprint)"
                ),
                {"new": new, "old": old},
            )
        ).all()
        regrouped = await conn.scalar(text(_REGROUPED), {"new": new, "old": old})
    fresh = [r for r in rows if r.summary in prompts and r.writer == f"openai:{MODEL}"]
    return {"changed": len(rows), "refreshed": len(fresh), "new_member_set": regrouped}


# Of the new snapshot's communities with a new fingerprint: those whose member set no community
# of the old snapshot had (re-clustering regrouped them), as opposed to same members, new facts.
_REGROUPED = """
WITH sig AS (
    SELECT snapshot_id, community_id, array_agg(entity_id ORDER BY entity_id) AS members
    FROM community_members WHERE snapshot_id IN (:old, :new) GROUP BY 1, 2
)
SELECT count(*) FROM communities n JOIN sig s ON s.snapshot_id = n.snapshot_id
    AND s.community_id = n.id
WHERE n.snapshot_id = :new
  AND NOT EXISTS (SELECT 1 FROM communities o WHERE o.snapshot_id = :old
                  AND o.fingerprint = n.fingerprint)
  AND NOT EXISTS (SELECT 1 FROM sig o WHERE o.snapshot_id = :old AND o.members = s.members)
"""


def summary_prompts(stub: OpenAIStub, start: int) -> set[str]:
    """First lines of the summary prompts logged from request ``start`` on."""
    with stub._lock:
        requests = stub.requests[start:]
    out = set()
    for r in requests:
        if r.path.endswith("/chat/completions") and chat_kind(r.body) == "summary":
            user = next(m for m in r.body["messages"] if m.get("role") == "user")
            out.add(str(user["content"]).splitlines()[0])
    return out


async def community_phase(
    deps: RecomputeDeps, policy: Policy, stub: OpenAIStub, *, force: str | None = None
) -> tuple[dict[str, Any], float]:
    """The scheduler's check (or a forced recompute), timed, with stale reports before and
    after and, when it published, how many changed communities it refreshed."""
    before = await staleness(deps.engine)
    start = len(stub.requests)
    t0 = time.perf_counter()
    if force is not None:
        result = await run_now(deps, force)
        outcome, ratio = "published", None
    else:
        ticked = await tick(deps, policy)
        result, outcome, ratio = ticked.result, ticked.outcome, ticked.state.ratio
    seconds = time.perf_counter() - t0
    with stub._lock:
        bodies = [r.body for r in stub.requests[start:] if r.path.endswith("/chat/completions")]
    out: dict[str, Any] = {
        "summary_calls_tokens_by_level": summary_levels(bodies),
        "outcome": outcome,
        "change_ratio": None if ratio is None else round(ratio, 4),
        "threshold": policy.threshold,
        "seconds": round(seconds, 2),
        "stale_before": before.to_json(),
    }
    if result is not None:
        snap = result.snapshot
        out["reason"] = result.reason
        out["snapshot"] = {
            "communities": snap.communities,
            "levels": snap.levels,
            "reports_generated": snap.reports_generated,
            "reports_reused": snap.reports_reused,
            "nodes": snap.nodes,
            "edges": snap.edges,
        }
        if before.snapshot_id is not None:
            prompts = summary_prompts(stub, start)
            out["refresh"] = await refreshed(deps, before.snapshot_id, snap.id, prompts)
    out["stale_after"] = (await staleness(deps.engine)).to_json()
    return out, seconds


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


async def run_phases(
    stack: Stack, stub: OpenAIStub, events: list[dict[str, Any]], seed: int
) -> dict[str, Any]:
    settings = Settings(
        openai_base_url=stub.base_url,
        community_reports="llm",
        llm_model=MODEL,
        embedding_backend="openai",
        embedding_model=EMBEDDING_MODEL,
    )
    deps = build_deps(settings, stack.url)
    policy = Policy(
        threshold=settings.recompute_threshold,
        min_interval_s=0.0,  # only the change ratio decides here
        max_staleness_s=settings.communities_max_staleness_s,
    )
    meter = Meter(stub)
    report: dict[str, Any] = {"threshold": policy.threshold}
    try:
        stack.warm_up(events[0])
        meter.take()  # the warm-up document's calls are nobody's
        print(f"full build: {len(events)} events", file=sys.stderr, flush=True)
        load = loadavg()
        ingest_s = ingest(stack, events)
        ingest_counts = meter.take()
        build, build_s = await community_phase(deps, policy, stub, force="requested")
        full = merge(ingest_counts, meter.take())
        report["full"] = {
            "ingest_s": round(ingest_s, 2),
            "community": build,
            "counts": full.to_json(),
            "measures": measures(full, ingest_s + build_s),
            "loadavg_before_after": [load, loadavg()],
        }

        ids = [str(e["doc_id"]) for e in events]
        by_id = {str(e["doc_id"]): e for e in events}
        small = max(1, round(0.01 * len(events)))
        edited_a = choose(ids, small, seed)
        deleted_a = choose(ids, small, seed + 1, exclude=edited_a)
        changes_a = [edited_event(by_id[d], 2) for d in edited_a]
        changes_a += [delete_event(by_id[d], 2) for d in deleted_a]
        print(f"(a): {small} edited, {small} deleted", file=sys.stderr, flush=True)
        load = loadavg()
        ingest_s = ingest(stack, changes_a)
        ingest_counts = meter.take()
        check, check_s = await community_phase(deps, policy, stub)
        counts = merge(ingest_counts, meter.take())
        report["a"] = {
            "edited": edited_a,
            "deleted": deleted_a,
            "ingest_s": round(ingest_s, 2),
            "community": check,
            "counts": counts.to_json(),
            "measures": measures(counts, ingest_s + check_s),
            "loadavg_before_after": [load, loadavg()],
        }
        stale = dataclasses.replace(policy, max_staleness_s=0.0)  # max staleness reached
        if check["outcome"] != "published":  # what max staleness will cost later
            later, later_s = await community_phase(deps, stale, stub)
            counts = meter.take()
            report["a_staleness"] = {
                "community": later,
                "counts": counts.to_json(),
                "measures": measures(counts, later_s),
            }

        large = max(1, round(0.10 * len(events)))
        edited_b = choose(ids, large, seed + 2, exclude=[*edited_a, *deleted_a])
        print(f"(b): {large} edited", file=sys.stderr, flush=True)
        load = loadavg()
        ingest_s = ingest(stack, [edited_event(by_id[d], 2) for d in edited_b])
        ingest_counts = meter.take()
        check, check_s = await community_phase(deps, policy, stub)
        if check["outcome"] != "published":  # under the threshold: the recompute comes later
            later, later_s = await community_phase(deps, stale, stub)
            check = {**check, "later_staleness_recompute": later}
            check_s += later_s
        counts = merge(ingest_counts, meter.take())
        report["b"] = {
            "edited": len(edited_b),
            "ingest_s": round(ingest_s, 2),
            "community": check,
            "counts": counts.to_json(),
            "measures": measures(counts, ingest_s + check_s),
            "loadavg_before_after": [load, loadavg()],
        }
    finally:
        await deps.engine.dispose()
    return report


def tables(report: Mapping[str, Any]) -> str:
    full = report["full"]["measures"]
    out = [
        render("(a) 1% edited + 1% deleted", phase_rows(full, report["a"]["measures"], TARGETS_A)),
        f"GraphRAG: {GRAPHRAG['a']}",
    ]
    if "a_staleness" in report:
        rows = phase_rows(full, report["a_staleness"]["measures"], {})
        out.append(render("(a+) the later max-staleness recompute", rows))
    out += [
        render("(b) 10% edited", phase_rows(full, report["b"]["measures"], TARGETS_B)),
        f"GraphRAG: {GRAPHRAG['b']}",
    ]
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=Path, default=DEFAULT_EVENTS)
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK} events")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    lines = args.events.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    if args.quick:
        events = events[:QUICK]
    describe = ["git", "describe", "--always", "--dirty"]
    commit = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, check=False)
    stub = OpenAIStub(chat_handler=answer).start()
    env = {
        "KGSTREAM_OPENAI_BASE_URL": stub.base_url,
        "KGSTREAM_EXTRACTOR_BACKEND": "openai",
        "KGSTREAM_EMBEDDING_BACKEND": "openai",
        "KGSTREAM_LLM_MODEL": MODEL,
        "KGSTREAM_EMBEDDING_MODEL": EMBEDDING_MODEL,
    }
    try:
        with indexer_stack(env=env) as stack:
            phases = asyncio.run(run_phases(stack, stub, events, args.seed))
    finally:
        stub.stop()
    report = {
        "commit": commit.stdout.strip(),
        "events": str(args.events),
        "documents": len(events),
        "seed": args.seed,
        **phases,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(tables(report), file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
