"""The one settings model. Read in entrypoints (``Settings()``), never at import time."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from services.core.cloudevents import DEFAULT_TYPES, TypeMapping, parse_type_mapping
from services.core.cpu_budget import parse_cpu_threads
from services.core.errors import ConfigurationError


class Settings(BaseSettings):
    """kgstream configuration; every field is settable as ``KGSTREAM_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="KGSTREAM_", extra="ignore")

    # --- infrastructure -------------------------------------------------
    home: Path = Field(
        default=Path(".kgstream"),
        description="State directory: embedded server data, pid files, the infra state file.",
    )
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL. Unset: the embedded PostgreSQL under `home` is used.",
    )
    kafka_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (host:port,...). Unset: the embedded tansu broker.",
    )
    embedded_user: str = Field(
        default="nobody",
        description="Unprivileged user that runs the embedded PostgreSQL when invoked as root.",
    )
    embedded_shared_buffers: str = Field(
        default="128MB",
        pattern=r"^[1-9][0-9]*(kB|MB|GB|TB)$",
        description=(
            "The embedded PostgreSQL's shared_buffers (PostgreSQL's own default, 128MB). A large"
            " corpus reads faster when its HNSW and hot tables fit: PostgreSQL's guide starts at"
            " 25% of the machine's memory. Applied at its next start."
        ),
    )
    # --- database bounds and probes (issue 18) ------------------------------------------
    db_connect_timeout_s: int = Field(
        default=5,
        ge=2,
        description="Longest a new database connection may take (libpq connect_timeout, whole "
        "seconds, at least 2), for every process.",
    )
    db_statement_timeout_s: float = Field(
        default=60.0,
        ge=0,
        description="Longest one SQL statement may run (PostgreSQL statement_timeout) on the "
        "connections of the indexer, the query API and the CLI; 0 = no limit.",
    )
    communities_statement_timeout_s: float = Field(
        default=1800.0,
        ge=0,
        description="statement_timeout of the communities worker and `kgstream recompute --now`, "
        "whose graph loads and snapshot writes grow with the corpus; 0 = no limit.",
    )
    readiness_budget_s: float = Field(
        default=0.8,
        gt=0,
        description="Time budget of a /readyz answer (its own database connection): 503 naming "
        "what did not answer beyond it. Keep it below the probe's timeout (Kubernetes: 1 s).",
    )
    status_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Time budget of `kgstream status` (one read): beyond it, an error and exit 1.",
    )
    # --- read replicas (issue 20; docs/deployment.md, "Read replicas") --------------------
    database_read_url: str | None = Field(
        default=None,
        description="Streaming replicas of the database the query API reads queries from (one "
        "PostgreSQL URL, or several separated by commas). Writes, API keys, ingest and status "
        "stay on KGSTREAM_DATABASE_URL. Unset: every read goes to the primary.",
    )
    read_fallback: Literal["primary", "unavailable"] = Field(
        default="primary",
        description="When no replica is usable (down, or further behind than "
        "KGSTREAM_READ_MAX_LAG_S) or one has not caught up with a query's min_snapshot / "
        "after_event within KGSTREAM_READ_WAIT_MAX_S: primary = read from the primary; "
        "unavailable = answer 503 (no replica usable) or 409 (not caught up).",
    )
    read_max_lag_s: float = Field(
        default=3.0,
        gt=0,
        description="A replica whose replay lag exceeds this is not read from. 3 s is the "
        "freshness target (published -> answerable, p99): a replica further behind would miss "
        "it on its own.",
    )
    read_wait_max_s: float = Field(
        default=3.0,
        ge=0,
        description="Longest a query with min_snapshot or after_event waits for its read target "
        "to have it: 409 beyond it. 3 s is the freshness target (published -> answerable, p99), "
        "so a caller asking right after publishing is answered whenever the pipeline meets it. "
        "Below KGSTREAM_QUERY_TIMEOUT_S (left unset under a timeout of 3 s or less: half of it).",
    )
    read_replica_check_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the query API measures each replica's lag (one statement on the "
        "primary and one per replica, on connections of their own): lag decisions and /readyz "
        "figures are at most this old plus one check.",
    )
    read_replica_retry_s: float = Field(
        default=5.0,
        gt=0,
        description="A replica that failed to connect or errored is not read from for this long; "
        "then the next successful check puts it back. 5 s = the default connect timeout: a dead "
        "replica costs the readers at most one failed connect per period.",
    )

    # --- topics ---------------------------------------------------------
    documents_topic: str = Field(default="kgstream.documents", description="Document events.")
    dlq_topic: str = Field(default="kgstream.documents.dlq", description="Dead letters.")
    snapshots_topic: str = Field(default="kgstream.snapshots", description="Snapshot events.")
    topic_partitions: int = Field(default=4, ge=1, description="Partitions when we create topics.")
    consumer_group: str = Field(default="kgstream-indexer", description="Indexer consumer group.")
    broker_session_timeout_s: float = Field(
        default=6.0, description="Consumer session timeout (tansu: joins take half of it)."
    )
    broker_heartbeat_interval_s: float = Field(default=1.5, description="Consumer heartbeat.")
    indexer_rejoin_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Longest the indexer's consumer may be out of its group (a rebalance, an "
        "eviction), or in it without fetching records that wait while the indexer has nothing "
        "to do (services/indexer/fetch_stall.py), before /healthz fails and the process "
        "exits to be restarted. Unset: 20 x broker_session_timeout_s (120 s): above faust's "
        "60 s rebalance timeout.",
    )
    broker_commit_interval_s: float = Field(
        default=0.5, description="Offset commit interval: bounds redelivery after a crash."
    )
    broker_fetch_max_wait_s: float = Field(
        default=0.1,
        gt=0,
        description="Longest a consumer fetch waits at the broker for records (faust hard-codes "
        "1.5 s). tansu does not answer a waiting fetch when records arrive, so this adds to "
        "freshness there (1.5 s: ~0.38 s per event; docs/BENCHMARKS.md, Freshness).",
    )

    # --- indexing -------------------------------------------------------
    embedding_dim: int = Field(
        default=384, ge=8, le=4096, description="Vector width; recorded in the database."
    )
    embedding_backend: Literal["onnx-minilm", "openai"] = Field(
        default="onnx-minilm", description="Offline ONNX MiniLM, or an OpenAI-compatible endpoint."
    )
    extractor_backend: Literal["spacy", "openai"] = Field(
        default="spacy", description="Offline spaCy NER + dependency relations, or an LLM."
    )
    spacy_relations: Literal["parse", "cooccurrence"] = Field(
        default="cooccurrence",
        description="spaCy relations: cooccurrence = entities sharing a sentence (no parser); "
        "parse = plus dependency-parse subject-verb-object relations, 1.3x slower extraction.",
    )
    chunk_tokens: int = Field(
        default=180, ge=16, description="Chunk size in cl100k tokens (fits MiniLM's 256 pieces)."
    )
    chunk_overlap: int = Field(default=30, ge=0, description="Token overlap between chunks.")
    max_document_chunks: int = Field(
        default=1000,
        ge=1,
        description="Documents that chunk into more are dead-lettered (oversize): at ~20 chunks/s "
        "of extraction per core, this bounds how long one document can hold the indexer "
        "(about a minute on 2 cores) while still admitting ~180k tokens of text.",
    )
    max_clock_skew_s: float = Field(
        default=300.0,
        ge=0,
        description="How far an event's occurred_at may lie ahead of its record's time (the "
        "Kafka timestamp, never later than the indexer's clock) and still order it; further "
        "ahead is a broken clock, and the event is ordered at its record's time "
        '(docs/ingest.md, "Ordering and clocks").',
    )
    history_days: float = Field(
        default=7.0,
        ge=0,
        description="How long superseded versions and deleted documents stay readable through "
        'as_of (alembic 0025; docs/retrieval.md, "As of"): the indexer keeps what a new '
        "version or a delete replaces and prunes it this many days after it was replaced. 0 "
        "keeps nothing (a delete erases at once, and as_of is refused). Seven days, like the "
        'accepted-events journal: "as it was last week".',
    )
    indexer_stall_after_s: float = Field(
        default=120.0,
        gt=0,
        description="Status calls a partition stalled when a transient failure has been retried "
        "this long, or records wait and its offset has not moved this long.",
    )
    embed_batch_size: int = Field(default=16, ge=1, description="Passages per embedding call.")
    cpu_threads: str = Field(
        default="auto",
        description="Threads of onnxruntime (embedding) and OpenMP/BLAS (numpy, spaCy) per "
        "process: auto = the CPUs the process may use (affinity mask, capped by the cgroup CPU "
        "quota), or a positive integer. One core per indexer: set 1.",
    )
    indexer_batch_size: int = Field(
        default=16, ge=1, description="Events whose CPU work (embedding, extraction) is shared."
    )
    indexer_batch_wait_s: float = Field(
        default=0.05, ge=0, description="How long a partial batch waits for more events."
    )
    curation_apply_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often an indexer looks for new or undone curations and resolves the "
        "documents they touch again (one indexer at a time; docs/curation.md).",
    )
    indexer_max_refusals: int = Field(
        default=10,
        ge=1,
        le=100,
        description="How many times the indexer retries one event that the database refuses "
        "with an error of its own (a SQLSTATE called transient, say out of memory or a deadlock, "
        "but answered by a server that is up) before it dead-letters the event as "
        "retries_exhausted: with the backoff doubling from 0.5 s to 30 s, 10 is about 2.5 "
        "minutes of its partition waiting. A database that does not answer is retried without "
        "end (nothing else could be applied either).",
    )
    indexer_large_document_chunks: int = Field(
        default=16,
        ge=1,
        description="An upsert with more new chunks than this is a large document: it is "
        "computed in a background lane while the other partitions go on (later events of its "
        "partition wait for it), and no embedding or extraction call covers more chunks than "
        "this, so a batch waits for at most one slice of it per call (~0.5 s at 16).",
    )
    max_document_bytes: int = Field(
        default=1_000_000,
        ge=1,
        description="Largest document event (bytes of its JSON): larger ones are rejected by "
        "`kgstream publish` and HTTP ingest and dead-lettered by the indexer. The default fits "
        "Kafka's 1 MiB message limit; raising it needs the broker's message.max.bytes and the "
        "topics' max.message.bytes raised too (docs: README, Limits).",
    )
    cloudevents_types: str = Field(
        default=DEFAULT_TYPES,
        description='CloudEvents in (docs/ingest.md, "CloudEvents"): which CloudEvent types are '
        "upserts and which deletes, as comma-separated suffix=action pairs (action upsert or "
        "delete; the longest suffix a type ends with wins; a suffix may be a whole type). A "
        "type that matches none is refused (HTTP 422, dead letter).",
    )

    # --- LLM (optional) -------------------------------------------------
    openai_base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL; unset means offline defaults."
    )
    openai_api_key: SecretStr = Field(default=SecretStr("unused"), description="API key.")
    llm_model: str = Field(default="gpt-4o-mini", description="Chat model for extraction/reports.")
    embedding_model: str = Field(
        default="text-embedding-3-small", description="Embedding model when backend=openai."
    )
    llm_timeout_s: float = Field(default=60.0, gt=0, description="Per-request LLM timeout.")
    llm_max_attempts: int = Field(
        default=4, ge=1, description="Tries per LLM call; only transient errors are retried."
    )
    llm_concurrency: int = Field(default=4, ge=1, description="Parallel LLM calls per process.")
    extraction_gleanings: int = Field(
        default=0, ge=0, le=3, description="Extra 'anything missed?' passes per chunk (LLM)."
    )

    # --- entity resolution ----------------------------------------------
    resolution_trigram_threshold: float = Field(
        default=0.6, gt=0, le=1, description="Name trigram similarity for a merge candidate."
    )
    resolution_embedding_threshold: float = Field(
        default=0.92, gt=0, le=1, description="Cosine of name embeddings that merges outright."
    )
    resolution_llm_adjudication: bool = Field(
        default=True,
        description="With an LLM configured (KGSTREAM_OPENAI_BASE_URL), let it decide merges in "
        "the ambiguous band.",
    )
    resolution_ambiguous_floor: float = Field(
        default=0.80,
        gt=0,
        le=1,
        description="Cosine from here up to the merge threshold is ambiguous: LLM adjudicates "
        "when configured, else no merge.",
    )

    # --- communities ----------------------------------------------------
    recompute_threshold: float = Field(
        default=0.10, gt=0, le=1, description="Change ratio above which communities recompute."
    )

    # --- communities (issue 4) -------------------------------------------
    consolidation_interval_s: float = Field(
        default=86400.0,
        ge=0,
        description="How often the communities worker runs consolidation (0: never). It "
        "merges only what an LLM adjudicator confirms, so it runs only when one is configured "
        '(docs/curation.md, "Consolidation").',
    )
    communities_check_interval_s: float = Field(
        default=10.0, gt=0, description="How often the communities worker checks the ratio."
    )
    communities_min_interval_s: float = Field(
        default=30.0, ge=0, description="Minimum time between two recomputes (any replica)."
    )
    communities_max_staleness_s: float = Field(
        default=3600.0,
        gt=0,
        description="Recompute after this long when the change ratio is above zero.",
    )
    communities_max_sizes: list[int] = Field(
        default=[10],
        min_length=1,
        description="Per level (the last repeats): communities larger than this split again.",
    )
    communities_resolutions: list[float] = Field(
        default=[1.0],
        min_length=1,
        description="Per level (the last repeats): Leiden modularity resolution.",
    )
    communities_max_levels: int = Field(
        default=5, ge=1, le=16, description="Depth limit of the community hierarchy."
    )
    communities_leiden_iterations: int = Field(
        default=3,
        ge=1,
        description="Level-0 Leiden iterations at most; stops early when one changes nothing.",
    )
    communities_split_iterations: int = Field(
        default=1, ge=1, description="Leiden iterations when a community is split again."
    )
    communities_seed: int = Field(default=42, description="Leiden random seed (determinism).")
    communities_resplit_margin: float = Field(
        default=0.5,
        ge=0,
        description="A community split again at a recompute keeps its previous children "
        "(new members join the child they are most tied to) unless the new split's quality "
        "beats theirs by more than this share: a kept split is at least 1/(1 + margin) as good "
        'as a fresh one. 0: take every split Leiden gives (docs/BENCHMARKS.md, "Community '
        'stability").',
    )
    communities_min_jaccard: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Member overlap a new community needs to keep an old community's id.",
    )
    snapshots_keep: int = Field(
        default=3, ge=1, description="Snapshots kept (the published one and the newest retired)."
    )
    community_reports: Literal["auto", "extractive", "llm", "none"] = Field(
        default="auto",
        description="Report writer: auto = LLM when KGSTREAM_OPENAI_BASE_URL is set, else "
        "extractive; none = no reports (titles stay empty).",
    )
    community_report_input_tokens: list[int] = Field(
        default=[6000, 4000],
        min_length=1,
        description="Per level (the last repeats): token budget of an LLM report's context.",
    )
    community_report_output_tokens: int = Field(
        default=1200, ge=64, description="max_tokens of one LLM report."
    )

    # --- query API ------------------------------------------------------
    api_host: str = Field(default="127.0.0.1", description="Query API bind address.")
    api_port: int = Field(default=8000, ge=0, le=65535, description="Query API port.")
    api_probe_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Also serve the query API's /healthz and /readyz on this port (same host), "
        "from a thread of their own: probes that never wait behind queries, even when a flood "
        "saturates the API's event loop (the Kubernetes manifests use 8001). Unset: off.",
    )
    # --- worker metrics and health (issue 9; docs/metrics.md) ---------------------------
    indexer_metrics_host: str = Field(
        default="127.0.0.1",
        description="Bind address of the indexer's /metrics, /healthz, /readyz.",
    )
    indexer_metrics_port: int = Field(
        default=9101, ge=0, le=65535, description="Indexer metrics port (0 = any free port)."
    )
    communities_metrics_host: str = Field(
        default="127.0.0.1",
        description="Bind address of the communities worker's /metrics, /healthz, /readyz.",
    )
    communities_metrics_port: int = Field(
        default=9102, ge=0, le=65535, description="Communities metrics port (0 = any free port)."
    )
    # --- authentication (issue 8) -------------------------------------------------------
    auth: Literal["auto", "required", "off"] = Field(
        default="auto",
        description="API keys on the query API: auto = required unless api_host is a loopback "
        "address (127.0.0.0/8, ::1, localhost); required; off. See docs/security.md.",
    )
    auth_allow_insecure: bool = Field(
        default=False,
        description="Let the API start with auth off on a non-loopback address (anyone who "
        "reaches the port may query, ingest and delete).",
    )
    auth_cache_ttl_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="Seconds a verified key is remembered per API process; a revoked key stops "
        "working within this time (0: verify against the database on every request).",
    )
    api_docs: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="/docs, /redoc and /openapi.json: auto = served when keys are not "
        "required, on = always, off = never.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Key `kgstream query` sends to the query API (Authorization: Bearer).",
    )
    query_hybrid: bool = Field(
        default=True, description="Vector mode fuses dense and BM25 rankings (RRF); off: dense."
    )
    query_rrf_k: int = Field(default=60, ge=1, description="Reciprocal rank fusion constant.")
    query_local_ranker: Literal["ppr", "paths"] = Field(
        default="ppr",
        description="Local mode's graph score: personalised PageRank from the seeds, or the "
        "path formula (Π weight × Π importance × 0.9^hops). See docs/BENCHMARKS.md.",
    )
    query_local_vector_weight: float = Field(
        default=1.0,
        ge=0,
        description="Local fusion weight of the dense score (z-scores; equal weights, no "
        "signal preferred; only the ratios matter. docs/retrieval.md).",
    )
    query_local_lexical_weight: float = Field(
        default=1.0, ge=0, description="Local fusion weight of the BM25 score (z-score)."
    )
    query_local_graph_weight: float = Field(
        default=1.0, ge=0, description="Local fusion weight of the graph score (z-score)."
    )
    query_local_reseed_passages: int = Field(
        default=5,
        ge=0,
        le=50,
        description="Local mode re-seeds a second PPR walk from the entities of this many top "
        "fused passages that the question does not name (0: one walk). docs/retrieval.md.",
    )
    query_local_hide_weak_edges: bool = Field(
        default=False,
        description="Local mode's walk leaves out weak relationships (a co-occurrence with one "
        "piece of evidence: relationships.weak); path mode, entity neighbours and communities "
        'keep them (docs/curation.md, "Pruning").',
    )
    query_local_chain_width: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Local mode follows chains of passages from this many top fused passages, "
        "one bridge entity per step, while each step adds a question term, and interleaves "
        "their later passages with the fused ranking (later hops of multi-hop questions; "
        "0: off). docs/retrieval.md.",
    )
    query_local_followups: int = Field(
        default=0,
        ge=0,
        le=3,
        description="With an LLM configured: after a local retrieval the LLM may name the fact "
        "still missing as a search query, this many times at most; each query's local "
        "retrieval is merged by reciprocal rank (IRCoT-style; 0: off). docs/retrieval.md.",
    )
    query_local_hub_damping: bool = Field(
        default=False,
        description="Local mode's passage-entity edges weigh 1/ln(1 + df) (df = passages "
        "mentioning the entity); off: every mention edge weighs 1. docs/retrieval.md.",
    )
    query_graph_memory: bool = Field(
        default=True,
        description="The query API holds the graph local mode walks in memory (built at start, "
        "refreshed from graph_changes) and walks it for every caller, as that caller may see "
        "it; off, for a query with filters, or on a replica behind the held graph, local mode "
        "reads the database. "
        'docs/retrieval.md, "The graph in memory".',
    )
    query_graph_refresh_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="How often the held graph takes the changes since its last refresh.",
    )
    query_path_max_hops: int = Field(
        default=6, ge=1, le=6, description="Longest path (hops) path mode and /v1/paths search."
    )
    query_global_communities: int = Field(
        default=8, ge=1, le=50, description="Community summaries global mode ranks and maps."
    )
    query_ground_metadata: bool = Field(
        default=True,
        description="A question that names a value of a facet of the documents' metadata (a "
        "source, a department: services/retrieval/facets.py) reads only the documents with it, "
        "when the query has no filters of its own; read again without them when they answer "
        "nothing.",
    )
    query_ab_share: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="The share of auto-routed queries that take the other arm's mode (a graph"
        " mode's question goes to vector, a vector one to local), for the A/B test of graph"
        " against vector routing: metrics and POST /v1/feedback per arm (docs/curation.md,"
        " 'Retrieval monitoring'). 0: off.",
    )
    query_api_probe_s: float = Field(
        default=0.3, gt=0, description="How long `kgstream query` waits for /readyz of the API."
    )
    ingest_max_events: int = Field(
        default=500, ge=1, description="Events one POST /v1/documents may carry."
    )
    # --- request limits (issue 8) -------------------------------------------------------
    api_max_body_bytes: int = Field(
        default=4_194_304,
        ge=1024,
        description="Largest HTTP request body (Content-Length or bytes streamed): 413 beyond "
        "it, refused before it is buffered. Keep it above KGSTREAM_MAX_DOCUMENT_BYTES.",
    )
    ingest_publish_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long HTTP ingest waits for the broker (connect and acknowledgements) "
        "before answering 503 with Retry-After.",
    )
    query_max_question_chars: int = Field(
        default=2000, ge=1, le=2000, description="Longest question of POST /v1/query: 422."
    )
    query_max_k: int = Field(
        default=50, ge=1, le=50, description="Largest k (contexts) of POST /v1/query: 422."
    )
    query_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Time budget of one API request (every route but /healthz, /readyz and "
        "/metrics): 504 beyond it.",
    )
    query_route_graph: bool = Field(
        default=True,
        description="Auto mode answers a question whose words state a typed graph plan (a "
        "count, list, ranking, comparison or impact analysis from a named entity along a "
        "relationship type of the graph) with that plan (services/retrieval/plan_rules.py).",
    )
    query_plan_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Time budget of one typed graph plan (POST /v1/graph/query, mode graph, "
        "MCP graph_query): a plan still running then is stopped and refused with 422 "
        "(services/retrieval/plan_exec.py). Capped by KGSTREAM_DB_STATEMENT_TIMEOUT_S when "
        "that is lower.",
    )
    query_max_concurrent: int = Field(
        default=16,
        ge=1,
        description="Requests served at once by one API process (every route but /healthz, "
        "/readyz and /metrics); more are answered 429 with Retry-After.",
    )
    query_max_concurrent_per_key: int = Field(
        default=8,
        ge=1,
        description="Of those, the most one API key (by key id, authenticated before it takes "
        "a place) may hold, so one client flooding leaves room for the others; requests "
        "without a key (only where keys are not required) are bound by "
        "KGSTREAM_QUERY_MAX_CONCURRENT alone. 429 with Retry-After beyond it.",
    )
    api_body_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Time an API request has for its whole body to arrive, after its key is "
        "checked and before it is admitted (a request takes an admission place only with its "
        "body in): 408 beyond it.",
    )
    api_max_waiting_bodies: int = Field(
        default=32,
        ge=1,
        description="API requests that may wait for their bodies at once (each holds at most "
        "KGSTREAM_API_MAX_BODY_BYTES of memory and no admission place). A request beyond it "
        "takes the place of the one that has sent nothing for longest, which is answered 408: "
        "callers that send nothing cannot keep out those that send their bodies.",
    )
    api_loop_stall_s: float = Field(
        default=15.0,
        gt=0,
        description="The probes port's /healthz and /readyz answer 503 when the API's main "
        "event loop has not ticked (once a second) for longer than this: a blocked loop is "
        "restarted by the liveness probe; a merely busy one still ticks.",
    )
    # --- status and dashboard (issue 9) -------------------------------------------------
    status_freshness_window_s: float = Field(
        default=600.0,
        gt=0,
        description="Status reports freshness p50/p99 over events applied in this many seconds.",
    )
    dashboard_sample_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the query API samples lag, change ratio and query latency for "
        "/dashboard (kept in memory, per API process).",
    )
    dashboard_window_s: float = Field(
        default=3600.0,
        ge=60,
        description="How far back /dashboard charts reach (database history and the samples).",
    )
    dashboard_refresh_s: float = Field(
        default=5.0, gt=0, description="How often the /dashboard page fetches fresh data."
    )

    log_level: str = Field(default="INFO", description="Python log level.")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines: text, or json (one object per line with event_id, doc_id, "
        "snapshot_id while an event or a snapshot is worked on).",
    )

    @field_validator("database_url")
    @classmethod
    def _normalise_dsn(cls, value: str | None) -> str | None:
        """Accept postgres:// and postgresql:// and always hand SQLAlchemy psycopg 3."""
        if value is None or value == "":
            return None
        for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
            if value.startswith(prefix):
                return "postgresql+psycopg://" + value[len(prefix) :]
        return value

    @field_validator("database_read_url")
    @classmethod
    def _read_urls(cls, value: str | None) -> str | None:
        """Each replica URL normalised like database_url; a clear error for one that is not."""
        if value is None or not value.strip():
            return None
        urls = [u.strip() for u in value.split(",") if u.strip()]
        normalised = [cls._normalise_dsn(u) or "" for u in urls]
        for given, url in zip(urls, normalised, strict=True):
            problem = _read_url_problem(url)
            if problem:  # a ConfigurationError: pydantic would echo the input (a password)
                raise ConfigurationError(
                    f"KGSTREAM_DATABASE_READ_URL: {_masked(given)!r} {problem} (expected "
                    "postgresql://user:password@host:port/dbname, several separated by commas; "
                    "a comma inside a password is written %2C)"
                )
        if len(set(normalised)) != len(normalised):
            raise ConfigurationError("KGSTREAM_DATABASE_READ_URL names the same replica twice")
        return ",".join(normalised)

    @field_validator("cpu_threads")
    @classmethod
    def _cpu_threads(cls, value: str) -> str:
        # A ConfigurationError (not a ValueError) passes through pydantic: the CLI prints it.
        return parse_cpu_threads(value)

    @field_validator("cloudevents_types")
    @classmethod
    def _cloudevents_types(cls, value: str) -> str:
        return parse_type_mapping(value).describe()  # a ConfigurationError names the setting

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError("chunk_overlap must be smaller than chunk_tokens")
        if self.embedding_backend == "openai" and not self.openai_base_url:
            raise ValueError("embedding_backend=openai needs KGSTREAM_OPENAI_BASE_URL")
        if self.extractor_backend == "openai" and not self.openai_base_url:
            raise ValueError("extractor_backend=openai needs KGSTREAM_OPENAI_BASE_URL")
        if self.read_wait_max_s >= self.query_timeout_s and "read_wait_max_s" not in (
            self.model_fields_set
        ):
            # The default wait under a shorter request budget: half of it, to answer in.
            self.read_wait_max_s = self.query_timeout_s / 2
        if self.read_wait_max_s >= self.query_timeout_s:  # (not echoing the input's URLs)
            raise ConfigurationError(
                "KGSTREAM_READ_WAIT_MAX_S must be below KGSTREAM_QUERY_TIMEOUT_S (a request that "
                "waits for a replica must still have time to answer)"
            )
        return self

    @property
    def home_dir(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def cloudevent_types(self) -> TypeMapping:
        """KGSTREAM_CLOUDEVENTS_TYPES, parsed (validated when the settings were read)."""
        return parse_type_mapping(self.cloudevents_types)

    @property
    def database_read_urls(self) -> list[str]:
        """The replica URLs of KGSTREAM_DATABASE_READ_URL, in order (empty: none)."""
        return self.database_read_url.split(",") if self.database_read_url else []


def _read_url_problem(url: str) -> str:
    """Why ``url`` cannot be a replica's SQLAlchemy URL ("" when it can)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "is not a URL"
    if parsed.drivername != "postgresql+psycopg":
        return "is not a PostgreSQL URL"
    if not parsed.host:
        return "names no host"
    if not parsed.database:
        return "names no database"
    return ""


def _masked(url: str) -> str:
    """``url`` with any password replaced, for error messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)
