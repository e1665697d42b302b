"""`kgstream eval`: ingest events into a fresh database in-process (no broker), then run every
question in every mode and summarise retrieval by doc_id and the answers against the reference.

The database is an embedded PostgreSQL in a temporary home unless a URL is given, or kept in a
directory (``--keep``) so later runs skip the ingest; events go through the indexer's own
``handle_batch`` (the same code as the stream), 16 at a time."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from services.core.access import Caller
from services.core.db import migrations
from services.core.db.engine import DbTimeouts, make_engine
from services.core.infra.postgres import EmbeddedPostgres
from services.core.llm.client import process_client
from services.core.models import build_embedder, build_extractor
from services.core.settings import Settings
from services.eval.abstention import abstains, unanswerable
from services.eval.answer_scores import references
from services.eval.communities import ensure_snapshot
from services.eval.metrics import QuestionResult, dedupe, mode_report, question_row
from services.indexer.deps import IndexerDeps, Outcome, RawRecord
from services.indexer.handlers import handle_batch
from services.retrieval.compose import graph_holder
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import QUERY_CPU_WORKERS, QueryService, build_query_service

log = logging.getLogger(__name__)
BATCH = 16
MODES = ("vector", "local", "global", "auto")  # the default
CHOOSABLE = (*MODES, "path", "graph")  # --modes may name these
OPERATOR = Caller.operator()  # the eval reads the whole corpus


@dataclass
class EvalConfig:
    """What to evaluate."""

    events: Path
    questions: Path
    modes: Sequence[str] = MODES
    k: int = 10
    database_url: str | None = None
    keep: Path | None = None  # an embedded home kept between runs (the ingest is reused)
    progress: bool = True
    on_service: Callable[[QueryService], QueryService] | None = None  # benchmarks tweak knobs


@dataclass
class EvalOutcome:
    """Per-mode reports plus what happened on the way."""

    k: int
    modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    ingest: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    results: dict[str, list[QuestionResult]] = field(default_factory=dict)  # per mode

    def to_json(self) -> dict[str, Any]:
        """The documented `--json` shape: {"k", "modes": {mode: {"overall", "by_type",
        "by_gold", "by_hops", "hop_ranks"}}}."""
        return {"k": self.k, "modes": self.modes}

    def details(self) -> Iterator[dict[str, Any]]:
        """One row per mode and question: what was ranked and answered, and its scores."""
        for mode, results in self.results.items():
            for r in results:
                yield {"mode": mode, **question_row(r, self.k)}


class EvalInputError(ValueError):
    """Input the eval cannot use (a bad JSONL line, a --keep directory that is not ours)."""


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Non-blank lines of a JSONL file as objects; a line that is not a JSON object is an
    EvalInputError naming the file and line."""
    out = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(value, dict):
                raise EvalInputError(f"{path}:{number}: not a JSON object")
            out.append(value)
    return out


@contextlib.contextmanager
def fresh_database(settings: Settings) -> Iterator[str]:
    """A migrated database on an embedded PostgreSQL in a temporary home, deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="kgstream-eval-") as home:
        pg = EmbeddedPostgres(
            Path(home), settings.embedded_user, shared_buffers=settings.embedded_shared_buffers
        )
        try:
            url = pg.start()
            migrations.upgrade(url, settings.embedding_dim)
            yield url
        finally:
            pg.purge()


# Settings whose value changes what the ingest (or the community snapshot) produces: a kept
# database built under other values is rebuilt. A prefix rule, so a new knob is covered.
INGEST_PREFIXES = (
    "embedding_",
    "extractor_",
    "extraction_",
    "spacy_",
    "chunk_",
    "max_document_",
    "llm_model",
    "resolution_",
    "communities_",
    "community_report",
)
KEEP_MARKER = "kgstream-eval.json"


def ingest_fingerprint(settings: Settings, events: Path) -> dict[str, Any]:
    """What a kept database was built from: the events file's sha256 and the ingest settings."""
    digest = hashlib.sha256(events.read_bytes()).hexdigest()
    dumped = settings.model_dump(mode="json")
    knobs = {k: v for k, v in sorted(dumped.items()) if k.startswith(INGEST_PREFIXES)}
    return {"events_sha256": digest, "settings": knobs}


@contextlib.contextmanager
def kept_database(
    settings: Settings, home: Path, fingerprint: dict[str, Any], notes: list[str]
) -> Iterator[tuple[str, bool]]:
    """(URL, whether it already holds this ingest) of an embedded PostgreSQL kept in ``home``
    (stopped afterwards, not deleted). A home built from other events or settings, or whose
    ingest did not finish, is rebuilt; a non-empty directory that is not a kept eval home is
    refused. The marker says ``"ingested": true`` only once the run succeeded."""
    marker = home / KEEP_MARKER
    if home.exists() and any(home.iterdir()) and not marker.exists():
        raise EvalInputError(
            f"--keep {home}: the directory is not empty and holds no kept eval database "
            f"({KEEP_MARKER} is missing); choose a new or empty directory"
        )
    pg = EmbeddedPostgres(
        home, settings.embedded_user, shared_buffers=settings.embedded_shared_buffers
    )
    found = json.loads(marker.read_text()) if marker.exists() else None
    reuse = found == {"fingerprint": fingerprint, "ingested": True} and pg.has_data()
    if found is not None and not reuse:
        why = (
            "its database is gone (as root it lives under /var/tmp)"
            if found.get("ingested") and found.get("fingerprint") == fingerprint
            else "built from other events or settings, or unfinished"
        )
        notes.append(f"--keep {home}: {why}; rebuilt")
        pg.purge()
    home.mkdir(parents=True, exist_ok=True)
    if not reuse:
        marker.write_text(json.dumps({"fingerprint": fingerprint, "ingested": False}) + "\n")
    try:
        url = pg.start()
        migrations.upgrade(url, settings.embedding_dim)
        yield url, reuse
        if not reuse:
            marker.write_text(json.dumps({"fingerprint": fingerprint, "ingested": True}) + "\n")
    finally:
        pg.stop()


async def ingest(
    deps: IndexerDeps, events: Sequence[dict[str, Any]], progress: bool
) -> dict[str, int]:
    """Apply events in order through the indexer's handler, BATCH at a time; outcome counts."""
    counts: dict[str, int] = {}
    with tqdm(total=len(events), desc="ingest", unit="doc", disable=not progress) as bar:
        for start in range(0, len(events), BATCH):
            chunk = events[start : start + BATCH]
            records = [
                RawRecord(
                    topic="eval",
                    partition=0,
                    offset=start + i,
                    key=str(e.get("doc_id", "")).encode(),
                    value=json.dumps(e, ensure_ascii=False).encode(),
                )
                for i, e in enumerate(chunk)
            ]
            outcomes: list[Outcome] = await handle_batch(deps, records)
            for outcome in outcomes:
                counts[outcome] = counts.get(outcome, 0) + 1
            bar.update(len(chunk))
    return counts


def hop_gold_ids(question: dict[str, Any]) -> tuple[str, ...]:
    """Each hop's gold doc_id in hop order from ``metadata.decomposition`` (MuSiQue); empty
    when the question has none or a hop names no gold document (no order is guessed)."""
    steps = (question.get("metadata") or {}).get("decomposition") or []
    ids = tuple(str(s.get("gold_doc_id") or "") for s in steps if isinstance(s, dict))
    return ids if len(ids) == len(steps) and all(ids) else ()


async def _no_dead_letter_topic(key: bytes | None, value: bytes) -> None:
    """Eval runs without a broker: dead letters stay in the dead_letters table."""


async def run_questions(
    service: QueryService,
    questions: Sequence[dict[str, Any]],
    mode: str,
    k: int,
    progress: bool,
) -> list[QuestionResult]:
    """Every question in one mode (after one untimed warm-up query); contexts deduplicated by
    doc_id, first k documents kept."""
    results = []
    # A document can fill several of the k slots with its chunks: ask for more, dedupe.
    depth = min(50, 2 * k)
    if questions:  # one untimed warm-up (model sessions, connection pool, plan caches)
        await service.query(
            QueryRequest(question=questions[0]["question"], mode=mode, k=depth), OPERATOR
        )
    for q in tqdm(questions, desc=mode, unit="q", disable=not progress):
        req = QueryRequest(question=q["question"], mode=mode, k=depth, explain=False)
        t0 = time.perf_counter()
        resp = await service.query(req, OPERATOR)
        latency = (time.perf_counter() - t0) * 1000
        results.append(
            QuestionResult(
                qid=str(q.get("qid", "")),
                question_type=str(q.get("question_type") or "all"),
                ranked_doc_ids=dedupe(c.doc_id for c in resp.contexts)[:k],
                gold=frozenset(q.get("gold_doc_ids", [])),
                latency_ms=latency,
                mode_used=resp.mode_used,
                answer=resp.answer,
                references=references(q),
                llm_calls=resp.tokens.get("calls", 0),
                llm_tokens=resp.tokens.get("prompt", 0) + resp.tokens.get("completion", 0),
                followup_tokens=resp.tokens.get("followup_tokens", 0),
                hop_gold=hop_gold_ids(q),
                num_hops=int((q.get("metadata") or {}).get("num_hops") or 0),
                unanswerable=unanswerable(q),
                abstained=abstains(resp.answer, resp.abstained),
                answer_set=q.get("answer_set"),
            )
        )
    return results


async def evaluate(settings: Settings, config: EvalConfig) -> EvalOutcome:
    """Ingest, build communities when the engine exists, run the questions. Without a
    community snapshot, global mode is reported unavailable (not answered by a fallback)."""
    events, questions = load_jsonl(config.events), load_jsonl(config.questions)
    outcome = EvalOutcome(k=config.k)
    with contextlib.ExitStack() as stack:
        reuse = False
        if config.database_url:
            url = config.database_url
        elif config.keep is not None:
            fingerprint = ingest_fingerprint(settings, config.events)
            url, reuse = stack.enter_context(
                kept_database(settings, config.keep, fingerprint, outcome.notes)
            )
        else:
            url = stack.enter_context(fresh_database(settings))
        # An offline evaluation: bulk ingest and recompute, no statement bound (as migrations).
        engine = make_engine(url, timeouts=DbTimeouts.from_settings(settings, statement_s=0))
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=1))
        client = process_client(settings)  # the process's one OpenAI client (None offline)
        embedder, extractor = build_embedder(settings, client), build_extractor(settings, client)
        deps = IndexerDeps.from_settings(
            settings,
            engine=engine,
            embedder=embedder,
            extractor=extractor,
            executor=pool,
            publish_dead_letter=_no_dead_letter_topic,
        )
        try:
            if reuse:
                outcome.notes.append(f"--keep {config.keep}: ingest reused")
            else:
                outcome.ingest = await ingest(deps, events, config.progress)
            unavailable = None
            if "global" in config.modes:
                unavailable = await ensure_snapshot(engine, settings, url)
                if unavailable is not None:
                    outcome.notes.append(f"global: {unavailable}")
            # the questions get the API's model threads, so latencies are the API's
            queries = stack.enter_context(ThreadPoolExecutor(max_workers=QUERY_CPU_WORKERS))
            graph = None
            if settings.query_graph_memory:  # as the API walks it, built after the ingest
                graph = graph_holder(settings, url)
                stack.callback(graph.close)
                await graph.caught_up()
            service = build_query_service(
                settings, engine, embedder, extractor, queries, client=client, graph=graph
            )
            if config.on_service is not None:
                service = config.on_service(service)
            for mode in config.modes:
                if mode == "global" and unavailable is not None:
                    outcome.modes[mode] = {"unavailable": unavailable}
                    continue
                results = await run_questions(service, questions, mode, config.k, config.progress)
                outcome.modes[mode] = mode_report(results, config.k)
                outcome.results[mode] = results
        finally:
            await engine.dispose()
    return outcome
