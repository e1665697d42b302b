"""Scale-out: N indexer processes on an N-partition topic (issue 10, deliverable 7).

For each N (default 1 and 2) and each KGSTREAM_CPU_THREADS value (default auto and 1): an
embedded PostgreSQL and tansu broker, an N-partition topic, N `kgstream worker indexer`
processes in one consumer group (bench/_scale_harness.py); every partition warmed up, then
the events published and timed until all are applied. Reports docs/s, the speedup over N=1
at the same thread setting, the CPU time of each worker and of PostgreSQL (all its
processes, from /proc) per second and per document, and how often backends wait on a lock
(pg_stat_activity sampled every 0.1 s: samples with any backend waiting on a Lock, and the
share of active backend samples waiting on one, by wait event).

    .venv/bin/python bench/bench_scaleout.py [--events EVENTS.jsonl] [--quick] [--runs 3]
        [--workers 1,2] [--threads auto,1]

The default input is the 994-document HotpotQA set; ``--quick`` takes its first 100 events.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import (  # noqa: E402
    Sampling,
    cpu_seconds,
    indexer_stack,
    postgres_cpu_seconds,
    wait_for,
)

DEFAULT = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events_full.jsonl"
QUICK_EVENTS = 100
# Entity-creation locks (services/indexer/resolution.py, transaction-scoped advisory locks, one
# per name key): the share of samples in which some transaction holds one. With one lock for
# all names (before issue 10) this was the utilisation of the write path's serial section.
_CREATION_LOCK_HELD = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
_ACTIVITY = text(
    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)


@dataclass
class LockSampler(Sampling):
    """Samples pg_stat_activity every ``interval`` s on a thread."""

    url: str
    interval: float = 0.1
    samples: int = 0
    with_lock_wait: int = 0
    active: int = 0
    waiting: Counter[str] = field(default_factory=Counter)
    creation_lock_held: int = 0
    _engine: Engine | None = None

    def sample(self) -> None:
        """The client backends' states and wait events now."""
        if self._engine is None:
            self._engine = create_engine(self.url, pool_size=1)
        with self._engine.connect() as conn:
            rows = conn.execute(_ACTIVITY).all()
            self.creation_lock_held += bool(conn.scalar(_CREATION_LOCK_HELD))
        locked = [r for r in rows if r.wait_event_type == "Lock"]
        self.samples += 1
        self.with_lock_wait += bool(locked)
        self.active += sum(r.state == "active" for r in rows)
        self.waiting.update(f"Lock:{r.wait_event}" for r in locked)

    def close(self) -> None:
        """Close the sampling connection."""
        if self._engine is not None:
            self._engine.dispose()

    def summary(self) -> dict[str, Any]:
        """Fractions of samples and of active backend samples waiting on a lock."""
        waits = sum(self.waiting.values())
        return {
            "samples": self.samples,
            "samples_with_lock_wait": round(self.with_lock_wait / max(1, self.samples), 3),
            "active_backends_waiting_on_lock": round(waits / max(1, self.active), 3),
            "creation_lock_held": round(self.creation_lock_held / max(1, self.samples), 3),
            "by_wait_event": dict(self.waiting.most_common()),
        }


def run_once(events: list[dict[str, Any]], workers: int, threads: str) -> dict[str, Any]:
    """One measured run: ``workers`` processes on a ``workers``-partition topic."""
    env = {"KGSTREAM_CPU_THREADS": threads}
    with indexer_stack(partitions=workers, workers=workers, env=env) as stack:
        warm = stack.warm_up_partitions(events[0])
        postmaster = stack.pg.pid()
        assert postmaster is not None, "the embedded PostgreSQL has no postmaster pid"
        pids = [w.pid for w in stack.workers]
        cpu0 = [cpu_seconds(p) for p in pids]
        pg0 = postgres_cpu_seconds(postmaster)
        with LockSampler(stack.url) as locks:
            t0 = time.perf_counter()
            stack.publish(events)
            done = wait_for(stack.url, len(events) + warm, 1800)
        seconds = done - t0
        worker_cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
        pg_cpu = postgres_cpu_seconds(postmaster) - pg0
    return {
        "seconds": round(seconds, 2),
        "docs_per_s": round(len(events) / seconds, 2),
        "worker_cores": [round(c / seconds, 2) for c in worker_cpu],
        "worker_cpu_ms_per_doc": round(1000 * sum(worker_cpu) / len(events), 1),
        "postgres_cores": round(pg_cpu / seconds, 2),
        "postgres_cpu_ms_per_doc": round(1000 * pg_cpu / len(events), 1),
        "locks": locks.summary(),
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median docs/s (whole run, so its CPU and lock figures match)."""
    ranked = sorted(runs, key=lambda r: float(r["docs_per_s"]))
    return ranked[(len(ranked) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=Path, default=DEFAULT)
    parser.add_argument("--quick", action="store_true", help=f"first {QUICK_EVENTS} events only")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="comma-separated process counts")
    parser.add_argument("--threads", default="auto,1", help="KGSTREAM_CPU_THREADS values")
    args = parser.parse_args()
    lines = [line for line in args.events.read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.quick:
        lines = lines[:QUICK_EVENTS]
    events = [json.loads(line) for line in lines]
    describe = ["git", "describe", "--always", "--dirty"]
    commit = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, check=False)
    report: dict[str, Any] = {
        "commit": commit.stdout.strip(),
        "documents": len(events),
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "configs": [],
    }
    for threads in args.threads.split(","):
        base = None
        for workers in (int(n) for n in args.workers.split(",")):
            runs = [run_once(events, workers, threads) for _ in range(args.runs)]
            median = _median_run(runs)
            rate = statistics.median(float(r["docs_per_s"]) for r in runs)
            base = rate if base is None else base
            report["configs"].append(
                {
                    "cpu_threads": threads,
                    "workers": workers,
                    "runs": len(runs),
                    "docs_per_s_median": rate,
                    "docs_per_s_runs": [r["docs_per_s"] for r in runs],
                    "speedup": round(rate / base, 2),
                    "median_run": median,
                }
            )
            print(json.dumps(report["configs"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
