"""Query throughput (issue 20, deliverable 4): requests per second and latency per mode for
closed-loop clients against one query API process.

    .venv/bin/kgstream eval --events EVENTS.jsonl --questions QUESTIONS.jsonl \\
        --modes vector,local,global --keep DIR          # once: ingest and a community snapshot
    .venv/bin/python bench/bench_throughput.py --keep DIR --questions QUESTIONS.jsonl
        [--modes vector,local,global] [--clients 50,200] [--seconds 20] [--replicas 1]

Starts the kept embedded PostgreSQL and one `kgstream worker query-api` on it (offline models,
settings from the environment), then for each mode and client count CLIENTS clients that each
post a question, wait for the answer and post the next, for SECONDS (a closed loop: the
offered load follows the service). A 429 (the admission gate, KGSTREAM_QUERY_MAX_CONCURRENT)
is retried after its Retry-After, as the project's client does. Prints one JSON line per run:
answered requests per second, their latency p50 / p99 (from the first attempt, so the wait
behind 429s counts), the 429s met, and whether p99 stayed within the 500 ms target. With
``--replicas N``, N streaming standbys of the kept database are made (tests/support/replica.py)
and the API reads only from them; each line then says how many reads went to each target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import Counter
from pathlib import Path

import httpx
from _query_api import ROOT, kept_query_api, quantile

DEFAULT_QUESTIONS = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "questions.jsonl"
TARGET_P99_S = 0.5


async def run(
    base: str, questions: list[str], mode: str, clients: int, seconds: float
) -> dict[str, object]:
    """CLIENTS closed-loop clients for SECONDS; the figures of the answered requests."""
    took: list[float] = []
    codes: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    until = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            n = i
            while time.monotonic() < until:
                body = {"question": questions[n % len(questions)], "mode": mode, "k": 10}
                n += clients
                start, status = time.monotonic(), 0
                while True:
                    try:
                        reply = await client.post("/v1/query", json=body)
                    except httpx.HTTPError:
                        codes[0] += 1
                        break
                    status = reply.status_code
                    codes[status] += 1
                    if status != 429 or time.monotonic() >= until:
                        break
                    await asyncio.sleep(float(reply.headers.get("Retry-After", "1")))
                if status == 200:
                    took.append(time.monotonic() - start)

        await asyncio.gather(*(one(i) for i in range(clients)))
    p99 = quantile(took, 0.99) if took else float("inf")
    return {
        "mode": mode,
        "clients": clients,
        "seconds": seconds,
        "answered_per_s": round(len(took) / seconds, 1),
        "p50_ms": round(quantile(took, 0.5) * 1000, 1) if took else None,
        "p99_ms": round(p99 * 1000, 1) if took else None,
        "p99_within_500ms": p99 <= TARGET_P99_S,
        "responses_by_status": dict(sorted(codes.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, required=True, help="`kgstream eval --keep` home")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    parser.add_argument("--modes", default="vector,local,global")
    parser.add_argument("--clients", default="50,200")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="streaming standbys of the kept database the API reads from (every read: "
        "KGSTREAM_READ_FALLBACK=unavailable); they run on this machine",
    )
    args = parser.parse_args()
    lines = args.questions.read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()]
    with kept_query_api(args.keep, replicas=args.replicas) as base:
        for mode in args.modes.split(","):
            asyncio.run(run(base, questions, mode, 4, 5))  # warm-up: models, caches, plans
            for clients in (int(c) for c in args.clients.split(",")):
                before = reads_by_target(base)
                figures = asyncio.run(run(base, questions, mode, clients, args.seconds))
                after = reads_by_target(base)
                figures["replicas"] = args.replicas
                figures["reads_by_target"] = {
                    t: int(n - before.get(t, 0.0)) for t, n in after.items() if n > before.get(t, 0)
                }
                print(json.dumps(figures), flush=True)


def reads_by_target(base: str) -> dict[str, float]:
    """kgstream_query_reads_total by target, from the API's /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    found = re.findall(r'^kgstream_query_reads_total\{target="([^"]+)"\} (\S+)$', text, re.M)
    return {target: float(value) for target, value in found}


if __name__ == "__main__":
    main()
