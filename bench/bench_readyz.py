"""/readyz latency of the query API under a query flood (issue 18, finding 13).

    .venv/bin/kgstream eval --events services/cli/sample/events.jsonl \\
        --questions services/cli/sample/questions.jsonl --modes vector --keep /tmp/readyz-db
    .venv/bin/python bench/bench_readyz.py --keep /tmp/readyz-db [--clients 200] [--seconds 20]
        [--code DIR] [--probe-port]

Starts the kept embedded PostgreSQL (built by `kgstream eval --keep`), a query API process
on it (from --code DIR, a source tree such as `git archive 4163b39 | tar -x -C DIR`, to measure
an older commit; default this tree), then CLIENTS clients that post local-mode questions back
to back for SECONDS while a prober asks /readyz every 0.25 s (timeout 10 s). Prints the
/readyz latency percentiles and the flood's answers by status (429s are the admission gate
refusing queries beyond KGSTREAM_QUERY_MAX_CONCURRENT, answered at once). --probe-port also
serves the probes on KGSTREAM_API_PROBE_PORT and asks /readyz there at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import httpx
from _query_api import ROOT, free_port, kept_query_api, quantile

QUESTIONS = ROOT / "services" / "cli" / "sample" / "questions.jsonl"


async def flood(base: str, questions: list[str], clients: int, until: float) -> Counter[int]:
    """CLIENTS clients asking local-mode questions back to back until ``until``."""
    codes: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            n = i
            while time.monotonic() < until:
                body = {"question": questions[n % len(questions)], "mode": "local", "k": 10}
                n += clients
                try:
                    codes[(await client.post("/v1/query", json=body)).status_code] += 1
                except httpx.HTTPError:
                    codes[0] += 1

        await asyncio.gather(*(one(i) for i in range(clients)))
    return codes


async def probe(base: str, until: float) -> list[float]:
    """/readyz latencies (seconds; a failure counts as 10 s) every 0.25 s until ``until``."""
    took = []
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                ok = (await client.get("/readyz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            took.append(time.monotonic() - start if ok else 10.0)
            await asyncio.sleep(0.25)
    return took


def figures(took: list[float]) -> dict[str, float]:
    return {
        "p50": round(quantile(took, 0.5) * 1000, 1),
        "p99": round(quantile(took, 0.99) * 1000, 1),
        "max": round(max(took) * 1000, 1),
        "over_1s": sum(t > 1.0 for t in took),
        "n": len(took),
    }


async def measure(base: str, probes: str | None, clients: int, seconds: float) -> dict[str, object]:
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()]
    idle = await probe(base, time.monotonic() + 3)
    until = time.monotonic() + seconds
    probers = [probe(base, until)] + ([probe(probes, until)] if probes else [])
    codes, (loaded, *on_probe_port) = await asyncio.gather(
        flood(base, questions, clients, until), asyncio.gather(*probers)
    )
    out: dict[str, object] = {
        "clients": clients,
        "seconds": seconds,
        "idle_readyz_p50_ms": round(quantile(idle, 0.5) * 1000, 1),
        "loaded_readyz_ms": figures(loaded),
        "queries_by_status": dict(sorted(codes.items())),
    }
    if on_probe_port:
        out["loaded_readyz_probe_port_ms"] = figures(on_probe_port[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, required=True, help="`kgstream eval --keep` home")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--code", type=Path, default=ROOT, help="source tree of the API")
    parser.add_argument("--probe-port", action="store_true", help="KGSTREAM_API_PROBE_PORT too")
    args = parser.parse_args()
    env, probes = {}, None
    if args.probe_port:
        env["KGSTREAM_API_PROBE_PORT"] = str(probe_port := free_port())
        probes = f"http://127.0.0.1:{probe_port}"
    with kept_query_api(args.keep, code=args.code, env=env) as base:
        figures = asyncio.run(measure(base, probes, args.clients, args.seconds))
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
