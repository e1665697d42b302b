"""Scale figures on a bulk-built database (issue 20, deliverable 2): build the synthetic
corpus's graph with bench/bulk_build.py, recompute the communities, then measure query latency
per mode as the operator and as a restricted (anonymous) caller, with the database's size by
table and the peak memory of every process.

    .venv/bin/python bench/bench_bulk_scale.py --documents 38000 --home /var/tmp/kg-bulk-38k
        [--seed 7] [--questions 100] [--runs 3] [--out report.json]
        [--skip-build] [--skip-recompute] [--hide-share 0.5]

Every phase runs in its own process (the builder, the recompute, the queries) while this one
samples, every second, that process's VmRSS and PostgreSQL's PSS (postmaster and backends,
shared buffers counted once): peak memory per process. The PostgreSQL of ``--home`` is started
here and stopped at the end, its data kept (``--skip-build`` measures an existing build again).

- recompute: one run of services/communities/recompute.recompute with the extractive report
  writer and the builder's hashed embedder for the report vectors (so global mode has
  communities to rank, without the embedding model's cost at 100k+ communities); the graph part
  is load + compute (Leiden) + write, reported apart from the reports' time;
- queries: 100 generated questions (synth_corpus.questions) per mode, one untimed warm-up per
  mode, through an in-process QueryService built as the API builds it (bench/bench_scale.py's
  query pass, with a caller): ``Caller.operator()`` and ``Caller()`` (anonymous: what API
  users get); ``--runs`` passes, the median of each percentile reported; then one profiling
  pass per mode and caller (bench/_statement_profile.py: the costliest statements, planned).
Retrieval quality means nothing here (the chunk vectors are a random projection).

The synthetic documents have no ACLs, so the anonymous caller sees every one and reads as the
operator (services/retrieval/visibility.py ``widened``). ``--hide-share F`` gives a fraction F
of them (by a hash of the id) an ACL the anonymous caller lacks for the query phase, making it
a caller who truly sees part of the corpus, and takes the ACL away again at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import MemorySampler, hide_share, table_sizes, unhide  # noqa: E402
from _statement_profile import profile_mode  # noqa: E402
from bench_scale import query_service, recompute_once  # noqa: E402
from bulk_build import URL_ENV  # noqa: E402
from bulk_rows import HashedEmbedder  # noqa: E402
from synth_corpus import Corpus, questions  # noqa: E402

from services.core.access import Caller  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.retrieval.schemas import QueryRequest  # noqa: E402

MODES = ("vector", "local", "global")  # the modes with latency targets
CALLERS = {"operator": Caller.operator(), "restricted": Caller()}
GRAPH_PHASES = ("load_s", "compute_s", "write_s")  # the recompute's graph part


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _recompute(url: str, seed: int) -> dict[str, Any]:
    settings = Settings(community_reports="extractive")
    embedder = HashedEmbedder(settings.embedding_dim, seed)
    report = await recompute_once(settings, url, embedder)
    report["graph_part_s"] = round(sum(report["timings"].get(k, 0.0) for k in GRAPH_PHASES), 2)
    report["reports"] = "extractive, hashed-projection embeddings"
    return report


async def _queries(
    url: str, asked: list[dict[str, Any]], runs: int, profile: bool, args: argparse.Namespace
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    callers = {who: CALLERS[who] for who in args.callers.split(",")}
    modes = args.modes.split(",")
    settings = Settings(query_graph_memory=args.graph_memory == "on")
    async with query_service(settings, url) as (service, engine):
        if service.graph is not None:
            out["graph_memory"] = service.graph.report()
        for who, caller in callers.items():
            for mode in modes:
                passes = [await _timed_pass(service, asked, mode, caller) for _ in range(runs)]
                out[f"{who}.{mode}"] = {
                    "runs": passes,
                    "p50_ms": round(statistics.median(p["p50_ms"] for p in passes), 1),
                    "p99_ms": round(statistics.median(p["p99_ms"] for p in passes), 1),
                }
        if profile:
            for who, caller in callers.items():
                for mode in modes:
                    try:
                        out[f"{who}.{mode}_profile"] = await profile_mode(
                            service, engine, asked, mode, caller=caller
                        )
                    except Exception as exc:  # noqa: BLE001 - the profile must not lose figures
                        out[f"{who}.{mode}_profile"] = {"failed": f"{exc}"[:500]}
    return out


async def _timed_pass(
    service: Any, asked: list[dict[str, Any]], mode: str, caller: Caller
) -> dict[str, Any]:
    """As services/eval/runner.run_questions: one untimed warm-up, then every question."""
    await service.query(QueryRequest(question=asked[0]["question"], mode=mode, k=20), caller)
    ms: list[float] = []
    modes_used: dict[str, int] = {}
    for q in asked:
        req = QueryRequest(question=q["question"], mode=mode, k=20, explain=False)
        t0 = time.perf_counter()
        resp = await service.query(req, caller)
        ms.append((time.perf_counter() - t0) * 1000)
        modes_used[resp.mode_used] = modes_used.get(resp.mode_used, 0) + 1
    return {
        "p50_ms": round(_percentile(ms, 0.5), 1),
        "p99_ms": round(_percentile(ms, 0.99), 1),
        "mode_used": modes_used,
    }


def _phase(args: argparse.Namespace) -> None:
    """Run inside a child process: one phase, JSON on stdout."""
    url = os.environ[URL_ENV]
    if args.phase == "recompute":
        report = asyncio.run(_recompute(url, args.seed))
    else:
        events = list(Corpus(args.documents, args.seed).events())
        asked = questions(events, args.questions, args.seed)
        del events
        report = asyncio.run(_queries(url, asked, args.runs, not args.no_profile, args))
    report["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(report))


def _quarter_of_memory() -> str:
    """25% of this machine's memory, in MB (PostgreSQL's guide for shared_buffers)."""
    total_kb = int(Path("/proc/meminfo").read_text().split()[1])  # MemTotal, first line
    return f"{total_kb // 4 // 1024}MB"


def _child(argv: list[str], url: str, postmaster: int | None) -> dict[str, Any]:
    """Run a phase in its own process, sampling its memory and PostgreSQL's."""
    env = {**os.environ, URL_ENV: url}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE)
    with MemorySampler(proc.pid, postmaster, None) as memory:
        stdout, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} {argv[1:3]} failed with exit {proc.returncode}")
    text = stdout.decode().strip()
    try:  # the builder prints indented JSON, a phase one line (after any other output)
        report: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        report = json.loads(text.splitlines()[-1])
    summary = memory.summary()
    report["process_rss_mib_sampled"] = summary.get("indexer_rss_mib", {}).get("peak")
    report["postgres_pss_mib"] = summary.get("postgres_pss_mib", {})
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, required=True)
    parser.add_argument("--home", type=Path, help="the embedded PostgreSQL's home (kept)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-recompute", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--shared-buffers",
        default=_quarter_of_memory(),
        help="the embedded PostgreSQL's shared_buffers (default: 25%% of RAM, PostgreSQL's"
        " starting point for a dedicated server; 128MB is its own default)",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated (default all)")
    parser.add_argument("--callers", default=",".join(CALLERS), help="operator,restricted")
    parser.add_argument(
        "--graph-memory",
        choices=("on", "off"),
        default="on",
        help="local mode walks the held graph (as the API, default) or the database",
    )
    parser.add_argument(
        "--hide-share",
        type=float,
        default=0.0,
        help="for the queries, this share of the documents gets an ACL the anonymous caller "
        "lacks (it then sees part of the corpus); taken away at the end",
    )
    parser.add_argument("--phase", choices=("recompute", "queries"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        _phase(args)
        return
    if args.home is None:
        parser.error("--home is required")
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    report: dict[str, Any] = {"commit": commit, "documents": args.documents, "seed": args.seed}

    def save() -> None:
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")

    run(args, report, save)
    print(json.dumps(report, indent=1))


def run(args: argparse.Namespace, report: dict[str, Any], save: Any) -> None:
    """Start the PostgreSQL of ``--home``, run the phases into ``report`` (saved after each),
    stop it."""
    load = [Path("/proc/loadavg").read_text().split()[:3]]
    pg = EmbeddedPostgres(args.home, shared_buffers=args.shared_buffers)
    report["shared_buffers"] = args.shared_buffers
    url = pg.start()
    postmaster = pg.pid()
    me = str(Path(__file__).resolve())
    common = ["--documents", str(args.documents), "--seed", str(args.seed)]
    try:
        if not args.skip_build:
            print("build", file=sys.stderr, flush=True)
            builder = str(ROOT / "bench" / "bulk_build.py")
            report["build"] = _child([builder, *common, "--from-env"], url, postmaster)
            save()
        if not args.skip_recompute:
            print("recompute", file=sys.stderr, flush=True)
            report["recompute"] = _child([me, *common, "--phase", "recompute"], url, postmaster)
            save()
        tables = table_sizes(url)
        report["tables"] = tables
        report["database_bytes"] = sum(t["bytes"] for t in tables.values())
        report["bytes_per_document"] = round(report["database_bytes"] / args.documents)
        save()
        print("queries", file=sys.stderr, flush=True)
        flags = ["--questions", str(args.questions), "--runs", str(args.runs)]
        flags += ["--no-profile"] if args.no_profile else []
        flags += ["--modes", args.modes, "--callers", args.callers]
        flags += ["--graph-memory", args.graph_memory]
        if args.hide_share:
            report["hidden_documents"] = hide_share(url, args.hide_share)
        report["queries"] = _child([me, *common, *flags, "--phase", "queries"], url, postmaster)
    finally:
        if args.hide_share:
            unhide(url)
        load.append(Path("/proc/loadavg").read_text().split()[:3])
        report["loadavg_before_after"] = load
        save()
        pg.stop()


if __name__ == "__main__":
    main()
