"""Retrieval quality and query latency per mode (`kgstream eval` underneath), optionally on a
synthetic larger corpus.

    .venv/bin/python bench/bench_query.py [--events E] [--questions Q] [--copies N]
        [--database-url URL] [--modes vector,local,global,auto] [--k 10] [--repeat R]

--copies N writes a SYNTHETIC corpus of N copies of the events: copy 0 is the original, copy i
gets doc_id "<doc_id>~i" and the title "<title> <i>", so the gold documents are still there
(with near-duplicate distractors). Ingest runs in-process through the indexer's handler into a
fresh embedded PostgreSQL, or into --database-url (events already applied are skipped, so a
kept database can be measured again). Latencies include embedding and NER of the question.
--repeat R asks every question R times per mode (latency percentiles over all of them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.cli.evaluate import table  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.eval.runner import EvalConfig, evaluate, load_jsonl  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "hotpotqa-train100"


def synthetic(events: list[dict[str, Any]], copies: int) -> list[dict[str, Any]]:
    """N copies of the events with new doc_ids, event ids and titles (copy 0 unchanged)."""
    out = list(events)
    for i in range(1, copies):
        for e in events:
            out.append(
                {
                    **e,
                    "event_id": f"{e['event_id']}~{i}",
                    "doc_id": f"{e['doc_id']}~{i}",
                    "title": f"{e.get('title', '')} {i}".strip(),
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=Path, default=DATA / "events.jsonl")
    parser.add_argument("--questions", type=Path, default=DATA / "questions.jsonl")
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--modes", default="vector,local,global,auto")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    events = synthetic(load_jsonl(args.events), args.copies)
    questions = load_jsonl(args.questions) * args.repeat
    with tempfile.TemporaryDirectory() as tmp:
        events_path, questions_path = Path(tmp) / "events.jsonl", Path(tmp) / "questions.jsonl"
        events_path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
        questions_path.write_text("".join(json.dumps(q) + "\n" for q in questions), "utf-8")
        config = EvalConfig(
            events_path,
            questions_path,
            [m for m in args.modes.split(",") if m],
            args.k,
            args.database_url,
            progress=True,
        )
        t0 = time.perf_counter()
        outcome = asyncio.run(evaluate(Settings(), config))
    report = outcome.to_json()
    report["documents"] = len(events)
    report["synthetic_copies"] = args.copies
    report["ingest"] = outcome.ingest
    report["notes"] = outcome.notes
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    print(table(outcome.to_json()), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
