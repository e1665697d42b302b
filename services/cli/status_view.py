"""`kgstream status` for people: the status document (services/core/status.py) as text, and
`--watch`, which draws it again every few seconds until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def render(data: dict[str, Any]) -> str:
    """The status document as aligned lines: counts first, then the sections issue 9 added."""
    lines: list[str] = []
    sections = {
        "indexer",
        "throughput",
        "freshness",
        "dead_letters_by_reason",
        "change",
        "snapshots",
        "tokens",
        "processes",
        "replicas",
        "curations",
    }
    for key, value in data.items():
        if key not in sections:
            lines.append(f"{key:>18}: {value}")
    for proc in data.get("processes", []):
        lines.append(
            f"{'process':>18}: {proc['name']} pid {proc['pid']} on {proc['host']}, "
            f"metrics {proc['metrics_url']}"
        )
    tp = data["throughput"]
    lines.append(
        f"{'throughput':>18}: applied {tp['1m']['applied_per_s']}/s over 1 min "
        f"({tp['1m']['applied']} applied, {tp['1m']['handled']} handled), "
        f"{tp['5m']['applied_per_s']}/s over 5 min ({tp['5m']['applied']} applied)"
    )
    fresh = data["freshness"]
    for since in ("occurred", "published"):
        f = fresh[f"since_{since}"]
        left_out = f", {f['excluded']} left out" if f.get("excluded") else ""
        lines.append(
            f"{'freshness':>18}: since {since}: p50 {_s(f['p50_s'])}, p99 {_s(f['p99_s'])} "
            f"({f['events']} events in the last {fresh['window_s']:g}s{left_out})"
        )
    change = data["change"]
    verdict = "over: a recompute is due" if change["over_threshold"] else "under"
    lines.append(
        f"{'change':>18}: ratio {change['ratio']:.4f}, threshold {change['threshold']} ({verdict})"
    )
    if (cur := data.get("curations")) is not None:
        waiting = (
            f", the oldest for {cur['oldest_pending_s']:g}s" if cur["oldest_pending_s"] else ""
        )
        lines.append(
            f"{'curations':>18}: {cur['in_force']} in force, {cur['pending']} not applied to the"
            f" stored documents yet{waiting}"
        )
    reasons = data["dead_letters_by_reason"]
    shown = ", ".join(f"{r} {n}" for r, n in reasons.items()) or "none"
    lines.append(f"{'dead letters':>18}: {shown}")
    for snap in data["snapshots"]:
        took = "" if snap["recompute_s"] is None else f", recompute {snap['recompute_s']:g}s"
        lines.append(
            f"{'snapshot':>18}: #{snap['id']} {snap['status']}, started {snap['created_at']}"
            f"{took}, {snap['communities']} communities on {snap['levels']} levels"
        )
    for t in data["tokens"]:
        lines.append(
            f"{'tokens':>18}: {t['purpose']} {t['model']}: {t['prompt_tokens']} prompt, "
            f"{t['completion_tokens']} completion"
        )
    for p in data["indexer"]["partitions"]:
        state = "STALLED" if p["stalled"] else "ok"
        retry = (
            f", retrying {p['retrying_for_s']}s: {p['last_error']}" if p["retrying_for_s"] else ""
        )
        lines.append(
            f"{'indexer':>18}: {p['topic']}/{p['partition']} {state}: next offset "
            f"{p['next_offset']}, lag {p['lag']}, idle {p['idle_s']}s{retry}"
        )
    lines.extend(_replica_lines(data.get("replicas", [])))
    return "\n".join(lines)


def _replica_lines(replicas: list[dict[str, Any]]) -> list[str]:
    """One line per read replica: its replay lag, whether the API reads from it, or its error."""
    lines = []
    for r in replicas:
        if r["error"]:
            state = f"NOT USED: {r['error']}"
        else:
            paused = ", replay paused" if r.get("replay_paused") else ""
            used = "used" if r.get("usable") else "NOT USED (behind the max lag)"
            state = f"lag {r['lag_bytes']} bytes, {_s(r['lag_s'])}{paused}: {used}"
        lines.append(f"{'replica':>18}: {r['name']} {r['database']} {state}")
    return lines


async def watch(
    read: Callable[[], Awaitable[dict[str, Any]]],
    *,
    interval_s: float,
    as_json: bool,
    out: TextIO = sys.stdout,
    stop: asyncio.Event | None = None,
) -> None:
    """Print the status every ``interval_s`` seconds until ``stop`` is set (or the task is
    cancelled): the screen is cleared first on a terminal; ``as_json`` prints one compact JSON
    document per line instead. A read under way when ``stop`` is set finishes first."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        data = await read()
        if as_json:
            out.write(json.dumps(data) + "\n")
        else:
            if out.isatty():
                out.write(CLEAR)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"kgstream status at {stamp} (every {interval_s:g}s, Ctrl-C to stop)\n")
            out.write(render(data) + "\n\n")
        out.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
