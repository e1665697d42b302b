"""Answers questions from PostgreSQL. Framework-free: the FastAPI app, the CLI and the eval all
call ``QueryService.query``. Retrieval reads one REPEATABLE READ, read-only transaction on the
published snapshot; model calls (embedding, NER, LLM) run in the executor, outside it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import openai
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.access import Caller
from services.core.embedding import Embedder
from services.core.erasure import WithheldCache
from services.core.extraction import Extractor
from services.core.model_meter import NO_METER, ModelMeter, embed_metered, extract_metered
from services.core.settings import Settings
from services.retrieval import answer as answers
from services.retrieval import graph_memory, monitoring, plan_exec, router
from services.retrieval.as_of import as_of_caller, past_reads
from services.retrieval.chains import ChainStart
from services.retrieval.community_vectors import CommunityVectors
from services.retrieval.contexts import (
    Retrieval,
    answer_contexts,
    context_mentions,
    contexts_for,
)
from services.retrieval.errors import Refused
from services.retrieval.facets import FacetCache, unmentioned
from services.retrieval.facets import Grounding as SourceGrounding
from services.retrieval.filters import scoped
from services.retrieval.global_mode import global_retrieve
from services.retrieval.graph_holder import GraphHolder
from services.retrieval.graph_memory import MemoryGraph
from services.retrieval.grounding import Grounding, ground
from services.retrieval.lexical import CorpusStats, StatsCache
from services.retrieval.llm import ChatModel, ChatReply, OpenAIChat, Usage
from services.retrieval.local import LocalMethods, LocalWeights, Ranker, local_search
from services.retrieval.map_reduce import map_reduce
from services.retrieval.multistep import FollowUps
from services.retrieval.paths import path_retrieve
from services.retrieval.plan_llm import llm_plan
from services.retrieval.plan_rules import (
    GraphWords,
    asks_graph,
    names_said,
    plan_for,
    visible_types,
)
from services.retrieval.plans import Plan, PlanAnswer, plan_text
from services.retrieval.replicas import ReadRouter, Wanted
from services.retrieval.schemas import Arm, Context, Mode, QueryRequest, QueryResponse
from services.retrieval.vector import CURRENT, PassageReads, hybrid_search
from services.retrieval.visibility import widened

T = TypeVar("T")
# Model threads of a query process: the question's embedding and its NER run side by side.
QUERY_CPU_WORKERS = 2
# The oldest held graph a caller who sees part of the corpus walks (seconds since its last good
# refresh): the freshness target's p99 (published -> answerable within 3 s, docs/BENCHMARKS.md).
# Older, it walks the database, which reads ACLs live: a failing refresh cannot keep a revoked
# document walkable. Refreshes run every 0.5 s, backing off to twice their own time.
RESTRICTED_MAX_AGE_S = 3.0


@dataclass(frozen=True)
class QueryConfig:
    """Retrieval knobs (settings `KGSTREAM_QUERY_*`)."""

    local_ranker: Ranker = "ppr"
    local_weights: LocalWeights = field(default_factory=LocalWeights)
    local_methods: LocalMethods = field(default_factory=LocalMethods)
    hybrid: bool = True
    rrf_k: int = 60
    path_max_hops: int = 6
    global_communities: int = 8
    local_followups: int = 0  # LLM follow-up searches after a local retrieval (0: none)
    ab_share: float = 0.0  # auto-routed queries that take the other arm's mode (monitoring.py)
    ground_metadata: bool = True  # questions naming a facet's value read those documents
    route_graph: bool = True  # auto mode answers a question a typed plan states (plan_rules)
    plan_timeout_s: float = 5.0  # a plan's time budget (plan_exec.py)

    @classmethod
    def from_settings(cls, settings: Settings) -> QueryConfig:
        """The configured knobs."""
        return cls(
            local_ranker=settings.query_local_ranker,
            local_weights=LocalWeights(
                vector=settings.query_local_vector_weight,
                lexical=settings.query_local_lexical_weight,
                graph=settings.query_local_graph_weight,
            ),
            local_methods=LocalMethods(
                reseed_passages=settings.query_local_reseed_passages,
                hub_damping=settings.query_local_hub_damping,
                chain_width=settings.query_local_chain_width,
                hide_weak_edges=settings.query_local_hide_weak_edges,
            ),
            hybrid=settings.query_hybrid,
            rrf_k=settings.query_rrf_k,
            path_max_hops=settings.query_path_max_hops,
            global_communities=settings.query_global_communities,
            local_followups=settings.query_local_followups,
            ab_share=settings.query_ab_share,
            ground_metadata=settings.query_ground_metadata,
            route_graph=settings.query_route_graph,
            plan_timeout_s=plan_budget_s(settings),
        )


def plan_budget_s(settings: Settings) -> float:
    """A plan's time budget: the configured one, within the database's statement_timeout when
    that is lower (a plan's statements run on the same connections, so the lower bound is the
    one that holds; it then refuses as a plan that ran too long, not a database error)."""
    cap = settings.db_statement_timeout_s
    return min(settings.query_plan_timeout_s, cap) if cap > 0 else settings.query_plan_timeout_s


@dataclass(frozen=True)
class _PlanRead:
    """Where a typed plan reads: the query's transaction and snapshot, the caller as its reads
    take it, and the held graph its steps may walk (None: the database)."""

    conn: AsyncConnection
    caller: Caller
    snapshot_id: int | None
    memory: MemoryGraph | None


@dataclass(frozen=True)
class _Asked:
    """What one retrieval reads, inside its snapshot transaction."""

    conn: AsyncConnection
    req: QueryRequest
    embedding: list[float]
    stats: CorpusStats
    snapshot_id: int | None
    caller: Caller
    memory: MemoryGraph | None = None  # the held graph, taken before the read began


@dataclass(frozen=True)
class QueryService:
    """Everything a query needs, built once by a composition root."""

    engine: AsyncEngine
    embedder: Embedder
    extractor: Extractor
    executor: Executor
    config: QueryConfig = field(default_factory=QueryConfig)
    llm: ChatModel | None = None
    stats: StatsCache = field(default_factory=StatsCache)
    community_vectors: CommunityVectors = field(default_factory=CommunityVectors)
    facets: FacetCache = field(default_factory=FacetCache)  # grounding of named sources
    withheld: WithheldCache = field(default_factory=WithheldCache)  # core/erasure.py
    meter: ModelMeter = NO_METER  # model calls (services/core/model_meter.py)
    reads: ReadRouter | None = None  # replicas or the primary (services/retrieval/replicas.py)
    graph_words: GraphWords = field(default_factory=GraphWords)  # plan_rules.py
    graph: GraphHolder | None = None  # the walked graph in memory (graph_holder.py)
    draw: Callable[[], float] = random.random  # the A/B split's draw in [0, 1)

    def read(
        self, want: Wanted | None = None
    ) -> AbstractAsyncContextManager[tuple[AsyncConnection, int | None]]:
        """A read-only REPEATABLE READ transaction on the published snapshot (connection,
        snapshot id), on a replica or the primary, showing at least ``want``."""
        return (self.reads or ReadRouter(self.engine)).snapshot(want)

    @contextlib.asynccontextmanager
    async def read_as(
        self, caller: Caller, want: Wanted | None = None
    ) -> AsyncIterator[tuple[AsyncConnection, int | None, Caller]]:
        """``read``, and the caller as its reads take it: whole-corpus when it sees every live
        document in this transaction's snapshot (visibility.widened), decided once per read
        for every statement in it."""
        async with self.read(want) as (conn, snapshot_id):
            yield conn, snapshot_id, await widened(conn, caller)

    def held_graph(self, req: QueryRequest | None = None) -> MemoryGraph | None:
        """The held graph for this query, taken before its read begins (so never newer than
        what a read of the primary sees): none for a query that waits for an event
        (``after_event``: the database shows it once the read has waited; the held graph may
        not yet). A read of a replica checks it again (``walkable``)."""
        if self.graph is None or (req is not None and req.after_event is not None):
            return None
        return self.graph.current()

    async def walkable(
        self, conn: AsyncConnection, memory: MemoryGraph | None, caller: Caller
    ) -> MemoryGraph | None:
        """``memory`` if this read's snapshot holds every change the held graph holds, else
        None (the walk reads the database). The held graph is read from the primary; a
        replica's read may be behind it, and a walk must not reach what its read cannot: the
        snapshot's last graph change (one index probe) must be at or past the graph's
        watermark. Without replicas every read is of the primary, begun after the graph was
        taken, so no check is made. A caller who sees part of the corpus walks it only while
        it was refreshed within RESTRICTED_MAX_AGE_S: a revoked ACL must not stay walkable
        for as long as refreshes fail (graph_holder.py keeps the last good state)."""
        if memory is None:
            return None
        if not caller.unfiltered and not self._recent():
            return None
        if self.reads is None or not self.reads.replicas:
            return memory
        return memory if await graph_memory.shown_by(conn, memory) else None

    def _recent(self) -> bool:
        age = None if self.graph is None else self.graph.age_s()
        return age is not None and age <= RESTRICTED_MAX_AGE_S

    async def run_blocking(self, fn: Callable[..., T], *args: object) -> T:
        """Run model code in the executor, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def query(
        self, req: QueryRequest, caller: Caller, *, answer: bool = True
    ) -> QueryResponse:
        """Retrieve contexts for the question in the requested (or routed) mode from what the
        caller can see, then answer (the LLM only ever reads what was retrieved); without
        ``answer`` the retrieval alone (no answer call: an agent's search)."""
        t0 = time.perf_counter()
        usage = Usage()
        caller = scoped(caller, req.filters)  # every read below sees only what they admit
        scope = caller.scope
        mode, routed_why, arm, named = await self._mode(req, usage)
        t_route = time.perf_counter()
        embedding, spans = await self._read_question(
            req.question, mode in ("local", "path", "graph")
        )
        t_embed = time.perf_counter()
        taken = self.held_graph(req)
        async with self.read_as(caller, Wanted.of(req)) as (conn, snapshot_id, reader):
            memory = await self.walkable(conn, taken, reader)
            graphed, mode, routed_why = await self._graph_first(
                _PlanRead(conn, reader, snapshot_id, memory),
                req,
                (mode, routed_why, arm, t0),
                usage,
            )
            if graphed is not None:
                return graphed
            retrieve = functools.partial(
                self._retrieve,
                conn,
                req,
                mode=mode,
                embedding=embedding,
                spans=spans,
                snapshot_id=snapshot_id,
                memory=memory,
            )
            if req.as_of is not None:  # the sources named now may not be those of then
                grounded, unheld = None, list[str]()
                result = await self._past(conn, req, req.as_of, embedding, as_of_caller(reader))
            else:
                grounded, unheld = await self._sources(conn, req.question, named, reader)
                grounded = None if scope is not None else grounded  # the caller's filters win
                result = await retrieve(
                    caller=scoped(reader, grounded.filters if grounded else None)
                )
            if grounded is not None:
                if result.contexts:  # the question's words, not the values (docs/retrieval.md)
                    result.notes.insert(0, f"grounded filters: {grounded.describe()}")
                    caller = scoped(caller, grounded.filters)  # the follow-ups read the same
                else:  # the named documents answer nothing: read as asked
                    result = await retrieve(caller=reader)
            if result.mode != "global":  # the offline answer (or an LLM's fallback) reads them
                result.mentions = await context_mentions(conn, answer_contexts(result))
        if (
            result.mode == "local"
            and self.llm is not None
            and self.config.local_followups
            and not unheld
        ):
            await self._follow_up(self.llm, req, result, usage, caller)  # outside the read
        t_retrieve = time.perf_counter()
        try:
            if answer and unheld:  # no LLM call: nothing here can answer it
                result.notes.append(f"not held: no document is from {', '.join(unheld)}")
                text_answer, support = answers.not_held(unheld), ""
            else:
                text_answer, support = (
                    await self._answer(req, result, usage) if answer else ("", "")
                )
        except Exception as exc:  # noqa: BLE001 - a failed LLM still leaves the passages
            result.notes.append(f"LLM answer failed ({type(exc).__name__}); extractive answer")
            text_answer, support = _offline_answer(req, result)
        t_end = time.perf_counter()
        said = (f"filters: {scope.describe()}" if scope is not None else "", routed_why)
        result.notes[:0] = [note for note in said if note]
        return QueryResponse(
            query_id=monitoring.query_id(result.mode, arm),
            arm=arm,
            path_pattern=monitoring.path_pattern(result),
            answer=text_answer,
            support=support,
            abstained=answers.abstains(text_answer),
            mode_used=result.mode,
            snapshot_id=snapshot_id,
            contexts=result.contexts
            if req.explain
            else [c.model_copy(update={"why": ""}) for c in result.contexts],
            paths=result.hops if req.explain else [],
            routes=result.routes if req.explain else [],
            communities=result.communities,
            grounded_entities=result.grounded if req.explain else [],
            timings={
                "route_ms": _ms(t0, t_route),
                "embed_ms": _ms(t_route, t_embed),
                "retrieve_ms": _ms(t_embed, t_retrieve),
                "answer_ms": _ms(t_retrieve, t_end),
                "total_ms": _ms(t0, t_end),
            },
            tokens=usage.to_dict(),
            notes=result.notes,
        )

    def _count(self, usage: Usage, reply: ChatReply | None, purpose: str) -> None:
        """Add a completion's tokens to the request's usage and report the call."""
        if reply is None:
            return
        usage.add(reply, purpose)
        self.meter.model_call(
            purpose,
            reply.model,
            inputs=1,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
        )

    async def _follow_up(
        self, llm: ChatModel, req: QueryRequest, result: Retrieval, usage: Usage, caller: Caller
    ) -> None:
        """LLM follow-up searches (services/retrieval/multistep.py), outside the first read;
        the merged top's mentions are read again for the offline fallback."""
        chained = self.config.local_ranker == "ppr"  # chains follow the PPR ranking only
        follow = FollowUps(
            llm,
            self.config.local_followups,
            self.config.rrf_k,
            self.run_blocking,
            chain_width=self.config.local_methods.chain_width if chained else 0,
        )

        async def search(query: str, start: ChainStart | None) -> Retrieval:
            embedding, spans = await self._read_question(query, with_spans=True)
            taken = self.held_graph(req)
            async with self.read_as(caller, Wanted.of(req)) as (conn, snapshot_id, reader):
                memory = await self.walkable(conn, taken, reader)
                return await self._retrieve(
                    conn,
                    req.model_copy(update={"question": query}),
                    mode="local",
                    embedding=embedding,
                    spans=spans,
                    snapshot_id=snapshot_id,
                    caller=reader,
                    chain_start=start,
                    memory=memory,
                )

        count = functools.partial(self._count, usage, purpose="followup")
        if await follow.run(req.question, result, req.k, search=search, count=count):
            async with self.read(Wanted.of(req)) as (conn, _):
                result.mentions = await context_mentions(conn, answer_contexts(result))

    async def _sources(
        self, conn: AsyncConnection, question: str, named: tuple[str, ...], reader: Caller
    ) -> tuple[SourceGrounding | None, list[str]]:
        """What the sources a question names make (its grounded filter), and those no
        document of the caller's is from: as the LLM classifier read them when it named any,
        else by rule (services/retrieval/facets.py)."""
        if not self.config.ground_metadata:
            return None, []
        vocabulary = await self.facets.get(conn)
        if named:
            grounded = vocabulary.ground_names(named, reader)
            unheld = vocabulary.unheld_names(named, reader)
        else:
            grounded = vocabulary.ground(question, reader)
            unheld = vocabulary.unknown_sources(question, reader)
        if not (reader.admin or reader.whole_corpus):
            # Which sources exist among documents the caller may not read must not show in
            # its answers: the rule is for callers who read every document.
            return grounded, []
        # A name the caller's documents mention may be what the question means: not missing.
        return grounded, await unmentioned(conn, reader, unheld)

    async def _mode(
        self, req: QueryRequest, usage: Usage
    ) -> tuple[Mode, str, Arm, tuple[str, ...]]:
        """The mode, why it was chosen, the A/B arm (monitoring.py), and the sources an LLM
        classifier read in the question (none without one)."""
        if req.as_of is not None:  # passages as they were (services/retrieval/as_of.py)
            return "vector", "", "requested", ()
        if req.mode != "auto":
            return req.mode, "", "requested", ()
        route = await self._route(req, usage)
        why = f"auto → {route.mode}: {route.reason}"
        if self.config.ab_share and self.draw() < self.config.ab_share:
            other = monitoring.ab_swap(route.mode)
            swapped = f"{why}; A/B: swapped to {other} (KGSTREAM_QUERY_AB_SHARE)"
            return other, swapped, "swapped", route.sources
        return route.mode, why, "routed", route.sources

    async def _route(self, req: QueryRequest, usage: Usage) -> router.Route:
        if self.llm is not None:
            try:
                route, reply = await self.run_blocking(router.llm_route, self.llm, req.question)
            except Exception:  # noqa: BLE001 - a failed classifier falls back to the heuristic
                route, reply = None, None
            self._count(usage, reply, "route")
            if route is not None:
                return route
        return router.heuristic_route(req.question)

    async def _retrieve(
        self,
        conn: AsyncConnection,
        req: QueryRequest,
        *,
        mode: Mode,
        embedding: list[float],
        spans: list[str],
        snapshot_id: int | None,
        caller: Caller,
        chain_start: ChainStart | None = None,
        memory: MemoryGraph | None = None,
    ) -> Retrieval:
        """The mode's retrieval, falling back (global and path and local to vector, path to
        local) with a note when the mode finds nothing to go on; ``caller`` as ``read_as``
        gives it; ``memory``: the held graph local mode walks (``held_graph``)."""
        stats = await self.stats.get(conn)
        asked = _Asked(conn, req, embedding, stats, snapshot_id, caller, memory)
        notes: list[str] = []
        if mode == "global":
            found = await global_retrieve(
                conn,
                req,
                embedding,
                snapshot_id,
                self.config.global_communities,
                caller=caller,
                vectors=self.community_vectors,
                erasures=self.withheld,
            )
            if found is not None:
                return found
            notes.append("global: no published community snapshot; answered by vector")
            mode = "vector"
        if mode in ("local", "path"):
            grounding = await ground(conn, req.question, spans, asked.stats, caller=caller)
            if grounding.weights and mode == "path":
                found = await self._path(asked, grounding)
                if found is not None:
                    return found
                notes.append("path: fewer than two entities or no path; answered by local")
            if grounding.weights:
                found = await self._local(asked, grounding, chain_start)
                if found is not None:
                    found.notes[:0] = notes
                    return found
            notes.append(f"{mode}: no entity of the question is in the graph; answered by vector")
        return Retrieval("vector", await self._hybrid(asked), notes=notes)

    async def _graph_first(
        self,
        read: _PlanRead,
        req: QueryRequest,
        asked: tuple[Mode, str, Arm, float],
        usage: Usage,
    ) -> tuple[QueryResponse | None, Mode, str]:
        """Graph mode, or auto mode when the question states a plan: its answer; otherwise
        the mode to go on with (graph mode that states no plan falls back to local) and why."""
        mode, why, arm, t0 = asked
        if not (
            mode == "graph"
            or (req.mode == "auto" and self.config.route_graph and req.as_of is None)
        ):
            return None, mode, why
        if req.mode == "graph":  # asked for: a refused plan is the answer (422)
            planned, notes = await self._graph(read, req, usage)
        else:
            planned, notes = await self._graph_or_not(read, req, usage)
            if planned is None:
                why = "; ".join(note for note in [*notes, why] if note)
        if planned is not None:
            if req.mode != "graph":
                notes.insert(0, "auto → graph: the question states a plan")
            took = time.perf_counter() - t0
            answered = _graph_response(
                req, planned, arm=arm, notes=notes, seconds=took, usage=usage
            )
            return answered, mode, why
        if mode != "graph":
            return None, mode, why
        fallback = (
            "graph: the question names no entity or uses no relationship type of the graph "
            "(docs/retrieval.md, Graph questions); answered by local"
        )
        return None, "local", "; ".join([fallback, *notes])

    async def _graph_or_not(
        self, read: _PlanRead, req: QueryRequest, usage: Usage
    ) -> tuple[PlanAnswer | None, list[str]]:
        """Auto mode's try: the plan's answer, or None (and why) when the question states no
        plan, or its plan is refused (too broad, too long) or reaches nothing, so the question
        goes on to the routed mode. Only the plan runs in a savepoint (a question that states
        none costs no round trip for it): a refused plan's aborted statement and its
        statement_timeout are rolled back with it."""
        plan, notes = await self._plan(read.conn, req, read.caller, usage)
        if plan is None:
            return None, notes
        savepoint = await read.conn.begin_nested()
        try:
            planned = await self._execute(read, plan)
        except Refused as exc:
            await savepoint.rollback()
            return None, [f"graph: {exc.title.lower()}; answered as routed"]
        if not planned.count and planned.comparison is None:
            await savepoint.rollback()
            return None, [*notes, "graph: the plan reached nothing; answered as routed"]
        await savepoint.commit()
        return planned, notes

    async def _graph(
        self, read: _PlanRead, req: QueryRequest, usage: Usage
    ) -> tuple[PlanAnswer | None, list[str]]:
        """Graph mode: the plan's answer (a refusal raised), or None when the question states
        no plan; and notes."""
        plan, notes = await self._plan(read.conn, req, read.caller, usage)
        if plan is None:
            return None, notes
        return await self._execute(read, plan), notes

    async def _plan(
        self, conn: AsyncConnection, req: QueryRequest, caller: Caller, usage: Usage
    ) -> tuple[Plan | None, list[str]]:
        """The typed plan the question states, and notes: the model's when an LLM is
        configured and the question reads as a graph question (or graph mode was asked for),
        else (or when the model's plan does not validate) the rules'."""
        types = await visible_types(conn, caller, await self.graph_words.get(conn))
        if not types and req.mode != "graph":
            return None, []  # a graph of co-occurrences only: no plan can be stated
        said = await names_said(conn, req.question, caller)
        plan, notes = None, []
        if self.llm is not None and (req.mode == "graph" or asks_graph(req.question)):
            names = [s.words for s in said]
            try:
                plan, reply, why = await self.run_blocking(
                    llm_plan, self.llm, req.question, names, types
                )
            except Exception as exc:  # noqa: BLE001 - a failed model leaves it to the rules
                reply, why = None, f"the model failed ({type(exc).__name__})"
            self._count(usage, reply, "plan")
            if plan is None:
                notes.append(f"graph: {why}; the rules read the question")
        return plan or plan_for(req.question, said, types), notes

    async def _execute(self, read: _PlanRead, plan: Plan) -> PlanAnswer:
        return await plan_exec.execute(
            read.conn,
            plan,
            read.caller,
            snapshot_id=read.snapshot_id,
            budget_s=self.config.plan_timeout_s,
            memory=read.memory,
        )

    async def plan_answer(self, plan: Plan, caller: Caller) -> PlanAnswer:
        """A typed plan's answer from what the caller can see (POST /v1/graph/query, MCP
        graph_query): its steps walk the held graph when this read may (``walkable``)."""
        taken = self.held_graph()
        async with self.read_as(caller) as (conn, snapshot_id, reader):
            memory = await self.walkable(conn, taken, reader)
            return await self._execute(_PlanRead(conn, reader, snapshot_id, memory), plan)

    async def _path(self, asked: _Asked, grounding: Grounding) -> Retrieval | None:
        """Paths between the question's entities, topped up with the best passages to k."""
        k, max_hops = asked.req.k, self.config.path_max_hops
        found = await path_retrieve(asked.conn, asked.req, grounding, max_hops, caller=asked.caller)
        if found is None or not found.contexts:
            return None
        if len(found.contexts) < k:
            seen = {c.chunk_id for c in found.contexts}
            found.contexts += [c for c in await self._hybrid(asked) if c.chunk_id not in seen]
            found.contexts = found.contexts[:k]
        return found

    async def _local(
        self, asked: _Asked, grounding: Grounding, chain_start: ChainStart | None
    ) -> Retrieval | None:
        """Local mode's passages (services/retrieval/local.py); None when it finds none."""
        ranked, hops = await local_search(
            asked.conn,
            asked.req.question,
            asked.embedding,
            grounding,
            asked.req.k,
            ranker=self.config.local_ranker,
            weights=self.config.local_weights,
            methods=self.config.local_methods,
            snapshot_id=asked.snapshot_id,
            stats=asked.stats,
            executor=self.executor,
            caller=asked.caller,
            chain_start=chain_start,
            memory=asked.memory,
        )
        if not ranked.ids:
            return None
        contexts = await contexts_for(asked.conn, ranked, caller=asked.caller)
        grounded, seeds = grounding.ranked_names(), sorted(grounding.weights)
        return Retrieval(
            "local", contexts, hops, grounded=grounded, seeds=seeds, chain=ranked.chain
        )

    async def _hybrid(self, asked: _Asked, reads: PassageReads = CURRENT) -> list[Context]:
        ranked = await hybrid_search(
            asked.conn,
            asked.req.question,
            asked.embedding,
            asked.req.k,
            stats=asked.stats,
            rrf_k=self.config.rrf_k,
            lexical=self.config.hybrid,
            caller=asked.caller,
            reads=reads,
        )
        return await contexts_for(asked.conn, ranked, caller=asked.caller, reads=reads)

    async def _past(
        self,
        conn: AsyncConnection,
        req: QueryRequest,
        as_of: datetime,
        embedding: list[float],
        caller: Caller,
    ) -> Retrieval:
        """Vector mode over the documents as they were at ``as_of``."""
        reads, stats = await past_reads(conn, as_of)
        contexts = await self._hybrid(_Asked(conn, req, embedding, stats, None, caller), reads)
        note = f"as of {as_of.isoformat()}: the documents as they were then"
        return Retrieval("vector", contexts, notes=[note])

    async def _read_question(
        self, question: str, with_spans: bool
    ) -> tuple[list[float], list[str]]:
        """The question's embedding and (for the graph modes) its entity spans: independent,
        so both are computed at once."""
        embedded, spans = await asyncio.gather(
            self.run_blocking(embed_metered, self.embedder, self.meter, "embed_query", [question]),
            self._spans(question) if with_spans else _no_spans(),
        )
        return embedded[0], spans

    async def _spans(self, question: str) -> list[str]:
        found = await self.run_blocking(extract_metered, self.extractor, self.meter, [question])
        extraction = found[0]
        return [e.name for e in extraction.entities]

    async def _answer(self, req: QueryRequest, result: Retrieval, usage: Usage) -> tuple[str, str]:
        """(answer, supporting sentence: offline answers only)."""
        if self.llm is None:
            return _offline_answer(req, result)
        if result.mode == "global" and result.communities:
            count = functools.partial(self._count, usage, purpose="answer")
            themes = await map_reduce(
                self.llm, req.question, result.communities, blocking=self.run_blocking, count=count
            )
            return themes, ""
        if not result.contexts:
            return answers.NO_ANSWER, ""
        reply = await self.run_blocking(answers.synthesise, self.llm, req.question, result.contexts)
        self._count(usage, reply, "answer")
        content = reply.content.strip()
        if not content:
            return _offline_answer(req, result)
        sources, unknown = answers.cited_sources(content, result.contexts)
        if not sources:
            result.notes.append("the LLM answer cites no source")
        if unknown:
            result.notes.append(f"the LLM answer cites sources that do not exist: {unknown}")
        return content, sources


def build_query_service(
    settings: Settings,
    engine: AsyncEngine,
    embedder: Embedder,
    extractor: Extractor,
    executor: Executor,
    *,
    client: openai.OpenAI | None = None,
    meter: ModelMeter = NO_METER,
    reads: ReadRouter | None = None,
    graph: GraphHolder | None = None,
) -> QueryService:
    """A QueryService with the configured knobs and, given the process's client, the LLM;
    ``reads``: where reads go (default: the primary, with the configured wait); ``graph``:
    the held graph local mode walks (none: the database)."""
    llm: ChatModel | None = None
    if client is not None:
        llm = OpenAIChat(client, settings.llm_model, settings.llm_max_attempts)
    return QueryService(
        engine=engine,
        embedder=embedder,
        extractor=extractor,
        executor=executor,
        config=QueryConfig.from_settings(settings),
        llm=llm,
        meter=meter,
        reads=reads or ReadRouter.from_settings(settings, engine, replicas=False),
        graph=graph,
    )


def _graph_response(
    req: QueryRequest,
    planned: PlanAnswer,
    *,
    arm: Arm,
    notes: list[str],
    seconds: float,
    usage: Usage,
) -> QueryResponse:
    """A graph-mode answer: the plan's rows as the answer's text, the plan and its evidence."""
    text = plan_text(planned)
    return QueryResponse(
        query_id=monitoring.query_id("graph", arm),
        arm=arm,
        answer=text,
        support="; ".join(
            f"{e.sentence} [{e.doc_id}]" for r in planned.rows[:3] for e in r.evidence[:1]
        ),
        abstained=answers.abstains(text),
        mode_used="graph",
        snapshot_id=planned.snapshot_id,
        contexts=[],
        grounded_entities=[r.name for r in planned.started_from] if req.explain else [],
        graph=planned,
        timings={"total_ms": seconds * 1000},
        tokens=usage.to_dict(),
        notes=notes + planned.notes,
    )


def _offline_answer(req: QueryRequest, result: Retrieval) -> tuple[str, str]:
    if result.mode == "global" and result.communities:
        return answers.extractive_global_answer(result.communities), ""
    return answers.extractive(req.question, result.contexts, result.mentions, result.chain)


async def _no_spans() -> list[str]:
    return []


def _ms(start: float, end: float) -> float:
    return round((end - start) * 1000, 2)
