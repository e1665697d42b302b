"""A process's query service: its database engine, models, LLM client and read router, built
from the settings (the query API's composition root adds its metrics: services/query_api/
app.py; the CLI and the eval take it as it is, without the HTTP edge)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from services.core.db.engine import DbTimeouts, make_engine
from services.core.llm.client import process_client
from services.core.model_meter import NO_METER, ModelMeter
from services.core.models import build_embedder, build_extractor
from services.core.settings import Settings
from services.retrieval.graph_holder import HOLDER_STATEMENT_S, GraphHolder
from services.retrieval.read_observer import NO_READ_OBSERVER, ReadObserver
from services.retrieval.replicas import ReadRouter
from services.retrieval.service import QUERY_CPU_WORKERS, QueryService, build_query_service


def build_service(
    settings: Settings,
    database_url: str,
    *,
    replicas: bool = False,
    meter: ModelMeter = NO_METER,
    observer: ReadObserver = NO_READ_OBSERVER,
    hold_graph: bool = False,
) -> QueryService:
    """The query service with its engine and models; with ``replicas`` (the API), reads go to
    KGSTREAM_DATABASE_READ_URL's replicas once its lag monitor runs (``measuring``). With
    ``hold_graph`` (the API: many queries) and KGSTREAM_QUERY_GRAPH_MEMORY, local mode walks
    a graph held in memory once it is built (``holding``); it is read from the primary, so a
    read of a replica walks it only when its snapshot shows the graph's watermark
    (``QueryService.walkable``)."""
    client = process_client(settings)  # the process's one OpenAI client (None offline)
    engine = make_engine(database_url, timeouts=DbTimeouts.from_settings(settings))
    reads = ReadRouter.from_settings(settings, engine, replicas=replicas, observer=observer)
    graph = None
    if hold_graph and settings.query_graph_memory:
        graph = graph_holder(settings, database_url)
    return build_query_service(
        settings,
        engine,
        build_embedder(settings, client),
        build_extractor(settings, client),
        ThreadPoolExecutor(max_workers=QUERY_CPU_WORKERS, thread_name_prefix="kgstream-query"),
        client=client,
        meter=meter,
        reads=reads,
        graph=graph,
    )


def graph_holder(settings: Settings, database_url: str) -> GraphHolder:
    """The held graph of services/retrieval/graph_holder.py, as configured (its bulk read may
    take longer than a query's statement bound: it has its own)."""
    timeouts = DbTimeouts.from_settings(settings, statement_s=HOLDER_STATEMENT_S)
    return GraphHolder(database_url, settings.query_graph_refresh_s, timeouts)
