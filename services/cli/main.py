"""The `kgstream` command. Each subcommand reads Settings once and builds what it needs."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from services.cli.common import JsonFlag, group
from services.cli.common import fail as _fail
from services.cli.common import settings as _settings
from services.cli.curate import curate_app
from services.cli.dlq import dlq_app
from services.cli.infra import db_app, infra_app
from services.cli.keys import keys_app
from services.cli.maintain import maintain_app
from services.cli.mcp_stdio import mcp
from services.cli.review import review_app
from services.core.settings import Settings

T = TypeVar("T")

app = group(__doc__ or "", add_completion=False)
app.add_typer(infra_app, name="infra")
app.add_typer(db_app, name="db")
app.add_typer(dlq_app, name="dlq")
app.add_typer(keys_app, name="keys")
app.add_typer(review_app, name="review")
app.add_typer(curate_app, name="curate")
app.add_typer(maintain_app, name="maintain")
app.command("mcp")(mcp)


@app.command()
def publish(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    topic: Annotated[str | None, typer.Option(help="Topic (default: the documents topic).")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Validate a JSONL file of document events and publish the valid ones keyed by doc_id.

    Invalid lines are reported by number and not sent; the exit code is 1 if any was."""
    from kafka.errors import KafkaError
    from tqdm import tqdm

    from services.core.infra.manager import resolve_endpoints
    from services.core.producer import (
        PublishReport,
        Rejected,
        make_producer,
        numbered_lines,
        publish_numbered,
        validate_line,
    )

    settings = _settings()
    endpoints = resolve_endpoints(settings)
    report = PublishReport()
    valid: list[tuple[int, dict[str, object]]] = []
    total = sum(1 for _ in numbered_lines(file))
    for number, raw in tqdm(
        numbered_lines(file), total=total, desc="validate", unit="line", disable=json_out
    ):
        event, reason = validate_line(raw, settings.max_document_bytes)
        if event is None:
            report.rejected.append(Rejected(number, reason or "invalid"))
        else:
            valid.append((number, event))
    try:
        producer = make_producer(endpoints.kafka_bootstrap_servers, settings)
    except KafkaError as exc:
        raise _fail(
            f"cannot reach the broker at {endpoints.kafka_bootstrap_servers}: {exc}"
        ) from exc
    batch = 500
    try:
        with tqdm(total=len(valid), desc="publish", unit="event", disable=json_out) as bar:
            for start in range(0, len(valid), batch):
                chunk = valid[start : start + batch]
                publish_numbered(producer, topic or settings.documents_topic, chunk, report)
                bar.update(len(chunk))
    finally:
        producer.close()
    report.rejected.sort(key=lambda r: r.line)
    if json_out:
        typer.echo(
            json.dumps({"sent": report.sent, "rejected": [r.__dict__ for r in report.rejected]})
        )
    else:
        for r in report.rejected:
            typer.secho(f"line {r.line}: {r.reason}", fg=typer.colors.YELLOW, err=True)
        typer.echo(f"sent {report.sent}, rejected {len(report.rejected)}")
    if report.rejected:
        raise typer.Exit(1)


@app.command()
def worker(name: Annotated[str, typer.Argument(help="indexer | communities | query-api")]) -> None:
    """Run one process (for real deployments: compose, Kubernetes)."""
    if name not in WORKERS:
        raise _fail(f"unknown worker {name!r}: choose indexer, communities or query-api", 2)
    from services.core.errors import KgstreamError

    settings = _settings(process=name)
    log = logging.getLogger("kgstream")
    # A worker that cannot go on says why in one log record (one JSON line in json mode): ours
    # (configuration, schema) without a traceback, as `main` prints them; anything else with.
    try:
        WORKERS[name](settings)
    except KgstreamError as exc:
        log.error("error: %s", exc)  # noqa: TRY400 - a known condition, not a bug
        raise typer.Exit(1) from None
    except Exception as exc:
        log.critical("the %s worker failed: %s", name, exc, exc_info=True)
        raise typer.Exit(1) from None


def _run_indexer(settings: Settings) -> None:
    from services.core.infra.manager import default_topics, resolve_endpoints
    from services.core.infra.topics import ensure_topics
    from services.core.producer import topic_max_message_bytes
    from services.indexer.app import run

    endpoints = resolve_endpoints(settings)
    ensure_topics(
        endpoints.kafka_bootstrap_servers,
        default_topics(settings),
        max_message_bytes=topic_max_message_bytes(settings),
    )
    run(settings, endpoints)


def _run_query_api(settings: Settings) -> None:
    import uvicorn

    from services.core.infra.manager import resolve_endpoints
    from services.query_api.app import create_app

    uvicorn.run(
        create_app(settings, resolve_endpoints(settings)),
        host=settings.api_host,
        port=settings.api_port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's loggers go through our handler (services/core/logs.py)
    )


def _run_communities(settings: Settings) -> None:
    from services.communities.app import run
    from services.core.infra.manager import resolve_endpoints

    run(settings, resolve_endpoints(settings))


WORKERS: dict[str, Callable[[Settings], None]] = {
    "indexer": _run_indexer,
    "communities": _run_communities,
    "query-api": _run_query_api,
}


@app.command()
def recompute(
    wait: Annotated[bool, typer.Option(help="Wait until a snapshot answers the request.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 600,
    now: Annotated[bool, typer.Option(help="Recompute in this process, no worker needed.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Ask the communities worker to recompute communities now (or do it here with --now)."""
    from services.communities.app import build_deps
    from services.communities.requests import request_recompute, wait_for_answer
    from services.communities.worker import run_now
    from services.core.db.engine import DbTimeouts, make_engine
    from services.core.infra.manager import resolve_endpoints

    settings = _settings()
    url = resolve_endpoints(settings).database_url

    async def go() -> dict[str, Any]:
        if now:
            deps = build_deps(settings, url)
            try:
                result = await run_now(deps)
            finally:
                await deps.engine.dispose()
            if result is None:
                return {"status": "locked"}
            return {"status": "published", **result.snapshot.event(), "timings": result.timings}
        engine = make_engine(url, timeouts=DbTimeouts.from_settings(settings))
        try:
            at = await request_recompute(engine)
            if not wait:
                return {"status": "requested", "requested_at": at.isoformat()}
            answer = await wait_for_answer(engine, at, timeout)
        finally:
            await engine.dispose()
        if answer is None:
            return {"status": "timeout", "requested_at": at.isoformat()}
        status = "published" if answer.status != "failed" else "failed"
        return {"status": status, "snapshot_id": answer.snapshot_id}

    data = asyncio.run(go())
    typer.echo(
        json.dumps(data, indent=2)
        if json_out
        else " ".join(f"{k}={v}" for k, v in data.items() if k != "timings")
    )
    if data["status"] not in ("requested", "published"):
        raise typer.Exit(1)


@app.command()
def query(
    question: Annotated[str, typer.Argument(help="The question.")],
    *,
    mode: Annotated[str, typer.Option(help="auto | vector | local | global | path")] = "auto",
    k: Annotated[int, typer.Option(min=1, max=50)] = 5,
    level: Annotated[int | None, typer.Option(help="Community level (global mode).")] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            help="FIELD=VALUE: only documents whose metadata field has this value (repeat:"
            " any of them for one field, all of them across fields)."
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only documents that occurred on or after this ISO date.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only documents that occurred on or before this ISO date.")
    ] = None,
    filters: Annotated[
        str | None,
        typer.Option(help="Filters as JSON, as the API takes them (docs/retrieval.md)."),
    ] = None,
    as_of: Annotated[
        str | None,
        typer.Option(
            "--as-of",
            help="The documents as they were at this ISO time with a zone (vector mode;"
            " docs/retrieval.md, As of).",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Answer a question: through the query API when it runs, else from the database."""
    from pydantic import ValidationError

    from services.cli.query import filters_from_options, run_query
    from services.retrieval.as_of import HistoryNotKept
    from services.retrieval.schemas import QueryRequest

    settings = _settings()
    try:
        scope = filters_from_options(where or [], since, until, filters)
        req = QueryRequest.model_validate(
            {"question": question, "mode": mode, "k": k, "level": level, "filters": scope}
            | ({"as_of": as_of} if as_of else {})
        )
    except (ValidationError, ValueError) as exc:
        raise _fail(str(exc), 2) from exc
    try:
        resp, _ = run_query(settings, req)
    except HistoryNotKept as exc:
        raise _fail(str(exc), 2) from exc
    if json_out:
        typer.echo(resp.model_dump_json(indent=2))
        return
    typer.echo(f"[{resp.mode_used}] {resp.answer}")
    if resp.support:
        typer.echo(f"  from: {resp.support}")
    for i, ctx in enumerate(resp.contexts, 1):
        typer.echo(f"  {i}. {ctx.title} ({ctx.doc_id}) score={ctx.score:.3f}")
    for route in resp.routes:
        typer.echo("  path: " + " → ".join(route.entities))
    for c in resp.communities[:3]:
        typer.echo(f"  community {c.id} (level {c.level}): {c.title}")


@app.command()
def graph(
    plan: Annotated[
        str,
        typer.Argument(
            help="A typed graph plan as JSON, or @FILE (schemas/graph_plan.v1.json;"
            " docs/retrieval.md, Graph questions)."
        ),
    ],
    *,
    json_out: JsonFlag = False,
) -> None:
    """Count, list, group, rank or compare entities of the graph with a typed plan: through
    the query API when it runs, else from the database."""
    from pydantic import ValidationError

    from services.cli.graph import describe, plan_json, read_plan, run_plan
    from services.retrieval.errors import Refused

    try:
        parsed = read_plan(plan)
    except (ValidationError, OSError, ValueError) as exc:
        raise _fail(f"not a valid plan: {exc}", 2) from exc
    try:
        answer = run_plan(_settings(), parsed)
    except Refused as exc:
        raise _fail(f"{exc.title}: {exc.detail}", 2) from exc
    typer.echo(plan_json(answer) if json_out else "\n".join(describe(answer)))


@app.command("eval")
def eval_cmd(
    *,
    events: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="Events JSONL.")],
    questions: Annotated[
        Path, typer.Option(exists=True, dir_okay=False, help="Questions JSONL (gold_doc_ids).")
    ],
    modes: Annotated[str, typer.Option(help="Comma-separated modes.")] = "vector,local,global,auto",
    k: Annotated[int, typer.Option(min=1, max=25)] = 10,
    database_url: Annotated[
        str | None, typer.Option(help="Use this database instead of a fresh embedded one.")
    ] = None,
    keep: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Keep the embedded database in this directory and reuse its ingest on later "
            "runs with the same events and ingest settings (a ranking change is evaluated in "
            "seconds).",
        ),
    ] = None,
    details: Annotated[
        Path | None,
        typer.Option(
            dir_okay=False, help="Also write one JSON line per mode and question to this file."
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Retrieval and answer quality, per mode, question type and hop count.

    Ingest the events into a fresh embedded PostgreSQL (in a
    temporary home, removed afterwards, or kept with --keep) in-process through the indexer's
    handler — no broker is needed — then ask every question in every mode. Reports recall@2,
    @5 and @k, all-gold@k, MRR and the last gold document's mean rank by doc_id; answer exact
    match, token F1 and containment against the reference answer and its aliases; latency
    p50/p99 and n: overall, per question type and per hop count (metadata.num_hops, else the
    number of gold documents). For questions with a hop decomposition (MuSiQue), each hop's
    gold passage per hop count: share in the top k and top 5 and mean rank, so one sees which
    hop is lost. Global mode needs a published community snapshot: it is reported unavailable
    when the community engine cannot build one."""
    from services.cli.evaluate import table
    from services.eval.runner import CHOOSABLE, EvalConfig, EvalInputError, evaluate

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(CHOOSABLE))
    if unknown or not chosen:
        raise _fail(f"unknown mode(s) {unknown}: choose from {', '.join(CHOOSABLE)}", 2)
    if keep is not None and database_url:
        raise _fail("--keep and --database-url exclude each other: --keep manages its own", 2)
    settings = _settings()
    config = EvalConfig(events, questions, chosen, k, database_url, keep=keep, progress=True)
    try:
        outcome = asyncio.run(evaluate(settings, config))
    except EvalInputError as exc:
        raise _fail(str(exc), 2) from exc
    if details is not None:
        with details.open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in outcome.details())
    if json_out:
        typer.echo(json.dumps(outcome.to_json()))
        return
    if outcome.ingest:
        typer.echo(f"ingest: {outcome.ingest}")
    for note in outcome.notes:
        typer.echo(f"note: {note}")
    typer.echo(table(outcome.to_json()))


@app.command()
def status(
    json_out: JsonFlag = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Refresh until Ctrl-C (with --json: one per line).")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="Seconds between refreshes (--watch).")
    ] = 2.0,
) -> None:
    """Counts, throughput, freshness, lag, dead letters by reason, change ratio against the
    threshold, snapshot history and token use."""
    from sqlalchemy.exc import DBAPIError

    from services.cli.status_view import render
    from services.cli.status_view import watch as watch_status
    from services.core.db.engine import DbTimeouts, make_engine
    from services.core.deadline import DeadlineExceeded, run_within
    from services.core.infra.manager import resolve_endpoints
    from services.core.replication import replica_status
    from services.core.status import database_status

    settings = _settings()
    endpoints = resolve_endpoints(settings)
    engine = make_engine(endpoints.database_url, timeouts=DbTimeouts.from_settings(settings))

    async def read() -> dict[str, Any]:
        doc, replicas = await asyncio.gather(
            database_status(
                engine,
                bootstrap=endpoints.kafka_bootstrap_servers,
                stall_after_s=settings.indexer_stall_after_s,
                recompute_threshold=settings.recompute_threshold,
                freshness_window_s=settings.status_freshness_window_s,
            ),
            # each replica within half the budget: a hung one leaves the rest of the report
            replica_status(
                engine,
                settings.database_read_urls,
                DbTimeouts.from_settings(settings),
                settings.status_timeout_s / 2,
                settings.read_max_lag_s,
            ),
        )
        return {**doc, "replicas": replicas}

    async def go() -> dict[str, Any] | None:
        try:
            if watch:  # runs until Ctrl-C: the read under way ends, then the loop
                stop = asyncio.Event()
                asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
                await watch_status(read, interval_s=interval, as_json=json_out, stop=stop)
                typer.echo("")
                return None
            return await read()
        finally:
            await engine.dispose()

    try:
        if watch:
            data = asyncio.run(go())
        else:  # one read, answered within its budget even when PostgreSQL hangs
            data = run_within(go, settings.status_timeout_s, "the database")
    except KeyboardInterrupt:  # Ctrl-C ends --watch: an ordinary way out, no traceback
        typer.echo("")
        return
    except (DeadlineExceeded, DBAPIError) as exc:
        where = engine.url.render_as_string(hide_password=True)
        raise _fail(f"no status from {where}: {str(exc).splitlines()[0][:300]}") from None
    if data is None:
        return
    typer.echo(json.dumps(data, indent=2) if json_out else render(data))


@app.command()
def up() -> None:
    """Everything in the foreground: infra if needed, migrations, indexer, query API.
    Ctrl-C stops all of it."""
    from services.cli.supervisor import running_stack

    settings = _settings()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with running_stack(settings, settings.api_port) as stack:
        typer.echo(f"kgstream is up: query API on {stack.api_url} (docs at {stack.api_url}/docs)")
        typer.echo(f"dashboard: {stack.api_url}/dashboard")
        typer.echo(f"graph explorer: {stack.api_url}/explorer")
        typer.echo(f"MCP for agents: {stack.api_url}/mcp (docs/integration.md)")
        for name, url in stack.metrics_urls().items():
            typer.echo(f"{name} metrics: {url}")
        typer.echo("Ctrl-C to stop")
        while not stop.wait(1.0):
            stack.check_alive()
    typer.echo("stopped")


@app.command()
def demo(
    events: Annotated[Path | None, typer.Option(help="Events JSONL (default: the sample).")] = None,
    questions: Annotated[Path | None, typer.Option(help="Questions JSONL.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for indexing.")] = 600,
) -> None:
    """Bring everything up, index the sample corpus, answer sample questions, shut down."""
    from services.cli.demo import run_demo

    sys.exit(run_demo(_settings(), events, questions, timeout))


def main() -> None:
    """Console-script entry point."""
    from services.core.errors import KgstreamError

    try:
        app()
    except KgstreamError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
