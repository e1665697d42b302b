"""Ingest throughput end to end, against the bare embed + extract loop in the same run.

Starts an embedded PostgreSQL and tansu broker in a temporary home, migrates, starts one
indexer worker process (`kgstream worker indexer`), waits until it consumes, publishes the
events with kafka-python and times publish -> all events processed. Then runs
bench/bench_embed_extract.py on the same events and prints both and their ratio as JSON.
The worker runs this checkout's code (its working directory is the repository root).

    .venv/bin/python bench/bench_ingest.py [EVENTS.jsonl] [--quick]

The default input is the 994-document HotpotQA set the target is measured on; ``--quick``
takes its first 100 events (a smoke run of well under a minute).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import indexer_stack, wait_for  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events_full.jsonl"
QUICK_EVENTS = 100


def pipeline(events: list[dict[str, object]]) -> dict[str, float]:
    with indexer_stack() as stack:
        stack.warm_up(events[0])  # the worker has joined its group and loaded its models
        t0 = time.perf_counter()
        stack.publish(events)
        published = time.perf_counter()
        done = wait_for(stack.url, len(events) + 1, 1800)
        return {
            "documents": len(events),
            "publish_s": round(published - t0, 2),
            "seconds": round(done - t0, 2),
            "docs_per_s": round(len(events) / (done - t0), 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("events", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--quick", action="store_true", help=f"first {QUICK_EVENTS} events only")
    args = parser.parse_args()
    lines = [line for line in args.events.read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.quick:
        lines = lines[:QUICK_EVENTS]
    events = [json.loads(line) for line in lines]
    measured = pipeline(events)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as same:
        same.write("\n".join(lines) + "\n")  # the bare loop reads exactly these events
        same.flush()
        bare = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "bench_embed_extract.py"), same.name],
            capture_output=True,
            text=True,
            check=True,
        )
    loop = json.loads(bare.stdout)
    ratio = round(measured["docs_per_s"] / float(loop["passages_per_s"]), 3)
    describe = ["git", "describe", "--always", "--dirty"]
    commit = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, check=False)
    report = {
        "commit": commit.stdout.strip(),
        "pipeline": measured,
        "bare_loop": loop,
        "ratio": ratio,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
