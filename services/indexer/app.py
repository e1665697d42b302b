"""Indexer process: the composition root. Builds the engine, models and faust app once; the
agent only turns a Kafka record into a RawRecord and hands it to the handler. Metrics, health
and the process's registration run beside it (services/core/telemetry/)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import faust
import mode
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core import accepted_events
from services.core.db.engine import DbTimeouts, make_engine
from services.core.indexer_health import OffsetReader
from services.core.infra.manager import Endpoints
from services.core.llm.client import process_client
from services.core.models import build_adjudicator, build_embedder, build_extractor
from services.core.producer import make_producer, max_request_size, send_all
from services.core.settings import Settings
from services.core.telemetry.process import ProcessOps
from services.core.telemetry.server import OpsServer
from services.indexer import consumer_state, fetch_wait, resume_positions, unreadable_batches
from services.indexer.curation_apply import apply_pending
from services.indexer.event_times import received_wall
from services.indexer.fetch_stall import (
    Activity,
    FetchStall,
    Sample,
    expected_offsets,
    fetch_positions,
    read_offsets,
    run_fetch_watch,
)
from services.indexer.graph_store import history
from services.indexer.handlers import (
    IndexerDeps,
    PreparedBatch,
    RawRecord,
    held,
    prepare_batch,
    write_batch,
)
from services.indexer.lanes import Lanes
from services.indexer.membership import (
    Membership,
    RejoinWatchdog,
    rejoin_timeout_s,
    run_watchdog,
)
from services.indexer.metrics import LagGauge, PrometheusIndexerObserver
from services.indexer.pipeline import run_pipelined
from services.indexer.topic_identity import (
    Described,
    TopicWatch,
    describe_topic,
    reconcile,
    resume_at,
    run_watch,
)

log = logging.getLogger(__name__)
REJOIN_EXIT_CODE = 3
"""The indexer's exit code when its consumer stayed out of its group too long (restart it)."""
FAILED_EXIT_CODE = 4
"""The indexer's exit code when its agent or a lane failed (a bug): restart it."""


def _record(event: faust.EventT[bytes]) -> RawRecord | None:
    """The record to handle; None for a stand-in that is only acked (the dead letter of its
    unreadable batch is written at the batch's last offset)."""
    message = event.message
    value, unreadable = message.value, None
    if isinstance(value, unreadable_batches.UnreadableBatch):
        if message.offset != value.last_offset:
            return None
        unreadable = value.reason
        value = bytes(value)
    return RawRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=value,
        timestamp=message.timestamp,  # faust gives seconds since the epoch
        received_at=received_wall(message.time_in),  # faust's monitor stamps it on fetch
        unreadable=unreadable,
        headers=_headers(message.headers),
    )


def _headers(headers: Any) -> tuple[tuple[str, bytes | None], ...]:
    """aiokafka's (key, value) pairs (faust may hand a mapping), as RawRecord keeps them."""
    if not headers:
        return ()
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(key), None if value is None else bytes(value)) for key, value in pairs)


def _position(event: faust.EventT[bytes]) -> tuple[str, int, int]:
    message = event.message
    return message.topic, message.partition, message.offset


def create_app(settings: Settings, endpoints: Endpoints, topic_id: str | None = None) -> faust.App:
    """The faust app with one agent on the documents topic (``topic_id``: its id when the
    process started, services/indexer/topic_identity.py)."""
    app = faust.App(
        settings.consumer_group,
        broker=f"kafka://{endpoints.kafka_bootstrap_servers}",
        processing_guarantee="at_least_once",  # tansu has no transactional producer
        broker_session_timeout=settings.broker_session_timeout_s,
        broker_heartbeat_interval=settings.broker_heartbeat_interval_s,
        broker_commit_interval=settings.broker_commit_interval_s,
        producer_max_request_size=max_request_size(settings),  # dead letters of maximal events
        web_enabled=False,
        web_bind="127.0.0.1",
        topic_allow_declare=False,  # topics are created explicitly (tansu defaults to 4 partitions)
        topic_disable_leader=True,
        store="memory://",  # no faust Tables: state lives in PostgreSQL
        # Stop and rebalance without waiting for the in-flight batch: it is not acked until it
        # is applied, so the next owner of the partition redelivers it (duplicates are skipped).
        stream_wait_empty=False,
        datadir=str(settings.home_dir / "faust"),
        key_serializer="raw",
        value_serializer="raw",
    )
    client = process_client(settings)  # the process's one OpenAI client (None offline)
    observer = PrometheusIndexerObserver()
    deps = IndexerDeps.from_settings(
        settings,
        engine=make_engine(endpoints.database_url, timeouts=DbTimeouts.from_settings(settings)),
        embedder=build_embedder(settings, client),
        extractor=build_extractor(settings, client),
        executor=ThreadPoolExecutor(max_workers=1, thread_name_prefix="kgstream-cpu"),
        extract_executor=ThreadPoolExecutor(max_workers=1, thread_name_prefix="kgstream-extract"),
        publish_dead_letter=_dlq_publisher(app, settings.dlq_topic),
        adjudicate=build_adjudicator(settings, client, observer),
        observer=observer,
    )
    documents = app.topic(settings.documents_topic, key_type=bytes, value_type=bytes)
    activity = Activity()  # the agent's batches and lanes, for the fetch watch
    _consumer_patches(app, settings, deps.engine)
    _operations(app, settings, endpoints, deps.engine, topic_id, activity=activity)

    _sweep_accepted_events(app, deps.engine)
    _prune_history(app, deps.engine, deps.history_days)

    @app.timer(interval=settings.curation_apply_interval_s, name="apply-curations")  # type: ignore[untyped-decorator]
    async def apply_curations() -> None:
        # Curations made through the API or the CLI reach the documents already stored.
        try:
            await apply_pending(deps)
        except Exception:  # they stay pending; the next tick tries again
            log.warning(
                "curation apply failed; retrying in %gs",
                settings.curation_apply_interval_s,
                exc_info=True,
            )

    _index_agent(app, documents, settings, deps, activity)
    return app


def _index_agent(
    app: faust.App,
    documents: faust.TopicT,
    settings: Settings,
    deps: IndexerDeps,
    activity: Activity,
) -> None:
    """The agent: batches of the documents topic, computed and written in a pipeline, acked
    once written; large documents in lanes of their own."""

    @app.agent(documents, name="index-documents")
    async def index(stream: faust.StreamT[bytes]) -> None:
        # Batches are acked by hand, only after write_batch returns: at-least-once. take_events
        # would ack the in-flight batch when its generator closes (a stop or a cancel while a
        # transient failure holds the batch), committing events that were never applied.
        concrete = cast(faust.Stream[bytes], stream)  # StreamT does not declare noack_take
        batches = concrete.noack_take(settings.indexer_batch_size, settings.indexer_batch_wait_s)
        Events = list[faust.EventT[bytes]]

        async def handle(events: Events, prepared: PreparedBatch) -> None:
            await write_batch(deps, prepared)  # outcomes are counted by the observer
            for event in events:
                if not held(prepared.held_from, *_position(event)):
                    await concrete.ack(event)

        async def in_lane(events: Events) -> None:  # a large document and what follows it
            records = [r for r in map(_record, events) if r is not None]
            await handle(events, await prepare_batch(deps, records))

        lanes = Lanes(
            in_lane,
            partition=lambda e: _position(e)[:2],  # equal to the signals' TP (topic, partition)
            size=lambda e: len(e.message.value or b""),
            batch_size=settings.indexer_batch_size,
            current=lambda e: e.message.generation_id == app.consumer_generation_id,
            on_failure=exit_after_failure,
        )
        activity.watch_lanes(lambda: bool(lanes.held()))

        # faust does not stop the agent on a rebalance: the lanes of revoked partitions stop.
        async def revoked(_: Any, /, *args: Any, signal: Any, **__: Any) -> None:  # noqa: ARG001 - faust sends it
            await lanes.revoke(args[0])

        async def assigned(_: Any, /, *args: Any, signal: Any, **__: Any) -> None:  # noqa: ARG001 - faust sends it
            lanes.assign(args[0])

        app.on_partitions_revoked.connect(revoked)
        app.on_partitions_assigned.connect(assigned)

        async def prepare(batch: Sequence[bytes]) -> tuple[Events, PreparedBatch]:
            # noack_take buffers events, not values; those of partitions held by a large
            # document go to its lane (services/indexer/lanes.py).
            activity.begin()  # until its write ends
            generation = app.consumer_generation_id  # older events were fetched before a rebalance
            activity.received(
                _position(e)[1:]
                for e in cast(Events, batch)
                if e.message.generation_id == generation
            )
            events = lanes.divert(cast(Events, batch))
            await lanes.room()
            records = [r for r in map(_record, events) if r is not None]
            prepared = await prepare_batch(deps, records, defer_large=True)
            lanes.hold(e for e in events if held(prepared.held_from, *_position(e)))
            return events, prepared

        async def write(_: Sequence[bytes], step: tuple[Events, PreparedBatch]) -> None:
            events, prepared = step
            try:
                await handle(events, prepared)
                lanes.start(prepared.held_from)  # their earlier events are written and acked
            finally:
                activity.end()

        # The write phase of one batch overlaps the compute phase of the next; a batch is
        # acked after its writes, batches in order (services/indexer/pipeline.py).
        # faust's supervisor would restart a failed agent in this process, with no lanes: their
        # partitions' later events would be applied first. A new process reads from the
        # committed offsets instead.
        try:
            await run_pipelined(batches, prepare, write)
        except Exception as exc:  # noqa: BLE001 - logged, and the process ends
            exit_after_failure(exc)
        finally:
            await lanes.close()


def _consumer_patches(app: faust.App, settings: Settings, engine: AsyncEngine) -> None:
    """The consumer's fetch wait (fetch_wait.py), unreadable batches (unreadable_batches.py),
    and, after a rebalance, partitions resumed no higher than the group's own record of them
    (resume_positions.py, topic_identity.py)."""
    fetch_wait.install(app, settings.broker_fetch_max_wait_s)
    unreadable_batches.install()
    group, topic = settings.consumer_group, settings.documents_topic

    async def lower(committed: dict[int, int | None]) -> dict[int, int]:
        async with engine.connect() as conn:
            return await resume_at(conn, group, topic, committed)

    resume_positions.install(app, topic, lower)


def _sweep_accepted_events(app: faust.App, engine: AsyncEngine) -> None:
    """Accepted events the indexer has handled need no keeping for a broker loss
    (services/core/accepted_events.py)."""

    @app.timer(interval=accepted_events.SWEEP_INTERVAL_S, name="sweep-accepted-events")  # type: ignore[untyped-decorator]
    async def sweep() -> None:
        try:
            async with engine.begin() as conn:
                await accepted_events.sweep(conn)
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.info("sweeping accepted events: %s: %s", type(exc).__name__, exc)


def _prune_history(app: faust.App, engine: AsyncEngine, days: float) -> None:
    """What new versions and deletes replaced is kept KGSTREAM_HISTORY_DAYS for as_of reads
    (services/indexer/graph_store/history.py): pruned as the worker starts and every
    SWEEP_INTERVAL_S after."""

    async def prune() -> None:
        try:
            async with engine.begin() as conn:
                await history.prune(conn, days)
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.info("pruning history: %s: %s", type(exc).__name__, exc)

    app.task(prune)
    app.timer(interval=history.SWEEP_INTERVAL_S, name="prune-history")(prune)


def _operations(
    app: faust.App,
    settings: Settings,
    endpoints: Endpoints,
    engine: AsyncEngine,
    topic_id: str | None,
    *,
    activity: Activity,
) -> None:
    """/metrics, /healthz, /readyz; registration and heartbeat; consumer lag, refreshed; the
    rejoin watchdog (services/indexer/membership.py) and the fetch watch (fetch_stall.py); the
    topic watch (topic_identity.py)."""
    membership = Membership(settings.documents_topic)
    limit = rejoin_timeout_s(settings.indexer_rejoin_timeout_s, settings.broker_session_timeout_s)
    watchdog = RejoinWatchdog(membership, settings.consumer_group, limit)
    stall = FetchStall(limit)
    offsets = OffsetReader(endpoints.kafka_bootstrap_servers)
    lag = LagGauge(engine, offsets, settings.consumer_group)

    async def assigned(_: Any, /, *args: Any, signal: Any, **__: Any) -> None:  # noqa: ARG001 - faust sends it
        membership.on_assigned(args[0])  # the signal sends the new assignment
        # Another member may have consumed them meanwhile: expect from faust's seek instead.
        activity.forget(p for t, p in args[0] if t == topic)

    async def revoked(_: Any, /, *__: Any, signal: Any, **___: Any) -> None:  # noqa: ARG001 - faust sends it
        membership.on_revoked()

    app.on_partitions_assigned.connect(assigned)
    app.on_partitions_revoked.connect(revoked)

    async def ready() -> str | None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return None if membership.joined else "the consumer has not joined its group yet"

    async def refresh_lag() -> None:
        if membership.joined:
            await lag.refresh(membership.assigned)

    ops = ProcessOps(
        engine,
        "indexer",
        server=OpsServer(
            settings.indexer_metrics_host,
            settings.indexer_metrics_port,
            ready,
            live=lambda: watchdog.overdue() or stall.reason,
            ready_budget_s=settings.readiness_budget_s,
            ready_give_up_s=settings.db_connect_timeout_s,
        ),
        refresh=[refresh_lag],
    )

    topic = settings.documents_topic
    topic_watch = TopicWatch(endpoints.kafka_bootstrap_servers, topic, topic_id)

    async def documents_ends() -> dict[int, int]:
        owned = {tp for tp in membership.assigned if tp[0] == topic}
        ends = await asyncio.to_thread(offsets.read, owned) if owned else {}
        return {p: end for (_, p), end in ends.items()}

    async def fetch_sample() -> Sample:
        member, owned = membership.joined, {p for t, p in membership.assigned if t == topic}
        if not member or activity.busy or not owned:
            return Sample(member, busy=True)  # nothing to compare: no broker round trip
        positions = fetch_positions(app, topic, owned)
        expected = expected_offsets(activity.expected, read_offsets(app, topic, owned))
        ends = await documents_ends()
        return Sample(membership.joined, activity.busy, positions, ends, expected)

    async def first_record(partition: int, start: int) -> int | None:
        return await asyncio.to_thread(offsets.first_offset, topic, partition, start, 5.0)

    class Operations(mode.Service):
        """Started and stopped with the faust app."""

        watch: asyncio.Task[None] | None = None
        topic_task: asyncio.Task[None] | None = None
        fetch_task: asyncio.Task[None] | None = None

        async def on_start(self) -> None:
            await ops.start()

            def on_overdue(reason: str) -> None:
                log.warning("consumer state: %s", consumer_state.describe(app))
                exit_for_restart(reason)

            self.watch = asyncio.create_task(run_watchdog(watchdog, on_overdue))
            self.fetch_task = asyncio.create_task(
                run_fetch_watch(stall, fetch_sample, on_overdue, first_record)
            )
            self.topic_task = asyncio.create_task(
                run_watch(engine, topic_watch, settings.consumer_group, documents_ends,
                          exit_for_restart)
            )  # fmt: skip

        async def on_stop(self) -> None:
            for task in (self.watch, self.topic_task, self.fetch_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await ops.stop()
            await asyncio.to_thread(offsets.close)

    app.service(Operations)


def exit_for_restart(reason: str) -> None:
    """End the process at once with REJOIN_EXIT_CODE. Not a graceful stop: the consumer is
    stuck in its group protocol, which a stop would wait on. Nothing is lost: only applied
    events are acked, and a member out of its group cannot commit anyway; the next process
    resumes from the committed offsets and skips what was already applied (by event_id)."""
    _exit(REJOIN_EXIT_CODE, reason)


def exit_after_failure(exc: BaseException) -> None:
    """End the process at once with FAILED_EXIT_CODE after the agent or a lane failed: the
    events of the failed batch and of every lane are unacked, and a new process reads them
    again from the committed offsets, in order."""
    _exit(FAILED_EXIT_CODE, f"the agent failed: {type(exc).__name__}: {exc}", exc)


def _exit(code: int, reason: str, exc: BaseException | None = None) -> None:
    log.error(
        "indexer exiting with code %d to be restarted: %s. A new process rejoins and resumes "
        "from the committed offsets",
        code,
        reason,
        exc_info=exc,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


def _dlq_publisher(app: faust.App, topic_name: str):  # type: ignore[no-untyped-def]
    dlq = app.topic(topic_name, key_type=bytes, value_type=bytes)

    async def publish(key: bytes | None, value: bytes) -> None:
        # Wait for the broker's ack, so the source offset is only committed after the DLQ write.
        fut = await dlq.send(key=key, value=value)
        await fut

    return publish


def run(settings: Settings, endpoints: Endpoints) -> None:
    """Run the indexer worker in this process until SIGINT/SIGTERM. First, before the consumer
    joins: a documents topic the broker replaced since this group last read it (a restarted
    broker on memory storage) is reported with what it lost, and read from its start."""
    described = describe_topic(endpoints.kafka_bootstrap_servers, settings.documents_topic)
    asyncio.run(_reconcile(settings, endpoints, described))
    app = create_app(settings, endpoints, None if described is None else described.topic_id)
    # Logging is already set up (services/core/logs.py): faust must not replace the root
    # handlers with its own (colour, plain text), or json mode would not be JSON.
    worker = faust.Worker(app, quiet=True, override_logging=False)
    worker.spinner = None  # no terminal spinner; faust then logs "[^Worker]: Ready" instead
    worker.execute_from_commandline()


async def _reconcile(settings: Settings, endpoints: Endpoints, described: Described | None) -> None:
    bootstrap, topic = endpoints.kafka_bootstrap_servers, settings.documents_topic

    def republish(records: list[tuple[bytes, bytes]]) -> int:
        producer = make_producer(bootstrap, settings, timeout_s=30)
        try:
            return send_all(producer, topic, records, timeout_s=60)
        finally:
            producer.close(timeout=10)

    engine = make_engine(endpoints.database_url, pool_size=1)
    try:
        await reconcile(engine, settings.consumer_group, topic, described, republish=republish)
    finally:
        await engine.dispose()
