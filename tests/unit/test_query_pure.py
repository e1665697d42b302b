from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import networkx as nx
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from services.client import query as client_query
from services.eval.metrics import (
    QuestionResult,
    all_gold_at,
    dedupe,
    last_gold_rank,
    mode_report,
    percentile,
    recall_at,
    reciprocal_rank,
)
from services.query_api.ingest import delete_event, validate_batch
from services.query_api.problems import as_problem
from services.retrieval.answer import parse_points
from services.retrieval.as_of import HistoryNotKept
from services.retrieval.global_mode import breadth_level
from services.retrieval.lexical import (
    DF_DRIFT,
    DocumentFrequencies,
    StatsCache,
    candidate_terms,
    idf,
    or_query,
    rrf,
    useful_terms,
)
from services.retrieval.llm import ChatReply
from services.retrieval.paths import k_shortest, named_ends, path_score
from services.retrieval.router import heuristic_route, parse_llm_route

GOLD = frozenset({"a", "b"})


def test_metrics_by_doc_id() -> None:
    ranked = dedupe(["x", "a", "a", "y", "b"])
    assert ranked == ["x", "a", "y", "b"]
    assert recall_at(ranked, GOLD, 2) == 0.5
    assert all_gold_at(ranked, GOLD, 3) == 0.0
    assert all_gold_at(ranked, GOLD, 4) == 1.0
    assert reciprocal_rank(ranked, GOLD) == 0.5
    assert reciprocal_rank(["x"], GOLD) == 0.0
    assert last_gold_rank(ranked, GOLD, 10) == 4.0
    assert last_gold_rank(ranked, GOLD, 3) == 4.0  # not all within the first 3: k + 1
    assert last_gold_rank(["x"], frozenset(), 10) == 11.0
    assert percentile([5.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([], 50) == 0.0


def test_mode_report_shape() -> None:
    three = frozenset({"a", "b", "c"})
    results = [
        QuestionResult(
            "1", "bridge", ["a", "b"], GOLD, 10.0, answer="Paris [doc-a]", references=("Paris",)
        ),
        QuestionResult(
            "2",
            "comparison",
            ["x", "a"],
            GOLD,
            30.0,
            answer="It is in Lyon.",
            references=("Paris", "Lyon"),
        ),
        QuestionResult(
            "3",
            "3hop",
            ["x", "y", "a", "b", "c"],
            three,
            20.0,
            answer="no idea",
            references=(),
            llm_calls=3,
            llm_tokens=300,
        ),
    ]
    report = mode_report(results, k=10)
    assert set(report) == {"overall", "by_type", "by_gold", "by_hops", "hop_ranks"}
    assert set(report["overall"]) == {
        "recall",
        "all_gold",
        "mrr",
        "p50_ms",
        "p99_ms",
        "n",
        "recall_at_2",
        "recall_at_5",
        "last_gold_rank",
        "answer_em",
        "llm_calls",
        "llm_tokens",
        "followup_tokens",
        "answer_f1",
        "answer_contains",
        "n_gold",
        "n_answerable",
        "majority_answer",
        "majority_share",
        "yes_no_accuracy",
        "n_yes_no",
        "unanswerable",
        "abstained",
        "abstain_recall",
        "abstain_precision",
        "abstain_wrong",
    }
    assert report["overall"]["all_gold"] == pytest.approx(2 / 3, abs=1e-4)
    assert report["overall"]["mrr"] == pytest.approx((1 + 0.5 + 1 / 3) / 3, abs=1e-4)
    assert report["overall"]["recall_at_2"] == pytest.approx((1 + 0.5 + 0) / 3, abs=1e-4)
    assert report["overall"]["recall_at_5"] == pytest.approx((1 + 0.5 + 1) / 3, abs=1e-4)
    assert report["overall"]["llm_calls"] == 1.0  # the cost per question
    assert report["overall"]["llm_tokens"] == 100.0
    # b is missing from the second ranking: it counts k + 1
    assert report["overall"]["last_gold_rank"] == pytest.approx((2 + 11 + 5) / 3, abs=1e-4)
    # answer metrics average over the two questions that have a reference
    assert report["overall"]["answer_em"] == 0.5  # "Paris" after its citation is removed
    assert report["overall"]["answer_contains"] == 1.0  # "Lyon" is an alias
    assert report["by_type"]["bridge"]["n"] == 1
    assert report["by_type"]["comparison"]["recall"] == 0.5
    assert set(report["by_gold"]) == {"2", "3"}
    assert report["by_gold"]["3"]["all_gold"] == 1.0
    assert report["by_gold"]["3"]["answer_f1"] == 0.0


@pytest.mark.parametrize(
    ("question", "mode"),
    [
        ("How is Christopher Nolan connected to Sathish Kalathil?", "path"),
        ("What is the relationship between Boston and Canton?", "path"),
        ("What are the main themes of the collection?", "global"),
        ("Who directed the film that was shot in Leland?", "local"),
        ("Are both magazines, the Woman's Viewpoint and Pick Me Up, British?", "local"),
        ("what is a good recipe for bread", "vector"),
    ],
)
def test_heuristic_router(question: str, mode: str) -> None:
    assert heuristic_route(question).mode == mode


def test_router_without_communities_does_not_pick_global() -> None:
    assert heuristic_route("overall themes", has_communities=False).mode == "vector"


def test_llm_route_parsing() -> None:
    route = parse_llm_route(ChatReply('{"mode": "global", "reason": "themes"}'))
    assert route is not None
    assert route.mode == "global"
    assert parse_llm_route(ChatReply('{"mode": "nonsense"}')) is None
    assert parse_llm_route(ChatReply("not json")) is None
    assert route.sources == ()
    named = parse_llm_route(
        ChatReply(
            '{"mode": "vector", "reason": "r", "sources": ["The Verge", " The Verge ", 3, "",'
            f' "{"x" * 201}", "Wired"]}}'
        )
    )
    assert named is not None
    assert named.sources == ("The Verge", "Wired")  # strings, trimmed, once, bounded


def test_lexical_helpers() -> None:
    assert idf(1, 100) > idf(50, 100) > 0
    assert idf(100, 100) >= 0
    assert or_query(["gallu", "o'neil"]) == "'gallu' | 'o''neil'"
    assert useful_terms({"rare": 1, "common": 90, "absent": 0}, 100) == {"rare": idf(1, 100)}
    assert candidate_terms({"a": 5, "b": 50, "c": 1000}, 100) == ["a", "b"]
    assert candidate_terms({"c": 1000}, 100) == ["c"]  # at least one term
    fused = rrf([[1, 2, 3], [3, 1]], k=60)
    assert max(fused, key=fused.__getitem__) == 1
    assert fused[3] > fused[2]


def test_paths_scoring_and_k_shortest() -> None:
    assert path_score([1.0]) == pytest.approx(0.9)
    assert path_score([0.5, 0.5]) == pytest.approx(0.25 * 0.81)
    g = nx.Graph()
    for rid, (a, b, s) in enumerate([(1, 2, 0.9), (2, 3, 0.9), (1, 4, 0.5), (4, 3, 0.9)]):
        g.add_edge(a, b, rid=rid, type="r", strength=s, ends=(a, b))
    g.add_edge(3, 5, rid=9, type="r", strength=0.9, ends=(3, 5))
    paths = k_shortest(g, 1, 3, k=5, max_hops=6)
    assert [p.entities for p in paths] == [[1, 2, 3], [1, 4, 3]]  # equal hops: better evidence
    assert paths[0].directed == [(1, "r", 2), (2, "r", 3)]
    assert k_shortest(g, 1, 5, k=5, max_hops=2) == []  # 3 hops needed
    assert k_shortest(g, 1, 99, k=5, max_hops=6) == []


def test_named_ends() -> None:
    assert named_ends("How are Boston and Canton related? between Boston and Canton") == (
        "Boston",
        "Canton",
    )
    assert named_ends("path from Aaron Spelling to Brad Kern?") == ("Aaron Spelling", "Brad Kern")
    assert named_ends("Who is Brad Kern?") is None


def test_breadth_level() -> None:
    assert breadth_level("What are the main themes?", [0, 1, 2]) == 0
    assert breadth_level("Who founded Two Dollar Radio?", [0, 1, 2]) is None


def test_map_points_parsing() -> None:
    reply = ChatReply(
        '{"points": [{"text": "Boston is a city", "score": 80}, {"text": "", "score": 5}]}'
    )
    assert parse_points(reply, 7) == [(80.0, "Boston is a city [7]")]
    assert parse_points(ChatReply("oops"), 7) == []


def test_ingest_validation_is_all_or_nothing() -> None:
    good = {
        "event_id": "e1",
        "type": "upsert",
        "doc_id": "d1",
        "text": "hello",
        "occurred_at": "2026-01-01T00:00:00Z",
    }
    events, problems = validate_batch(good, 10_000, 10)
    assert events == [good]
    assert problems == []
    events, problems = validate_batch([good, {"event_id": "e2", "type": "upsert"}], 10_000, 10)
    assert events == []
    assert problems[0]["index"] == 1
    assert problems[0]["event_id"] == "e2"
    assert any("doc_id" in e for e in problems[0]["errors"])
    assert validate_batch([good] * 3, 10_000, 2)[1][0]["errors"][0].startswith("3 events")
    assert validate_batch([], 10_000, 2)[1]
    assert validate_batch(good, 10, 2)[1][0]["errors"][0].startswith("oversize")
    event = delete_event("d1")
    assert validate_batch(event, 10_000, 1) == ([event], [])


class _CountingConn:
    """Answers the document-frequency statement from a table and records what it was asked."""

    def __init__(self, table: dict[str, int]) -> None:
        self.table, self.asked = table, list[list[str]]()

    async def execute(self, _statement: object, values: dict[str, list[str]]) -> Any:
        self.asked.append(list(values["lex"]))
        rows = [(lex, self.table.get(lex, 0)) for lex in values["lex"]]
        return type("Result", (), {"all": lambda _self: rows})()


async def test_document_frequencies_are_reused_until_the_corpus_moves() -> None:
    conn = _CountingConn({"film": 120, "nolan": 3})
    dfs = DocumentFrequencies(chunks=1000)
    db = cast(AsyncConnection, conn)
    first = await dfs.of(db, ["nolan", "film", "nolan"])
    assert first == {"nolan": 3, "film": 120}
    again = await dfs.of(db, ["film", "inception"])
    assert again == {"film": 120, "inception": 0}
    assert conn.asked == [["film", "nolan"], ["inception"]]  # only what was not known
    dfs.chunks = 1000 + int(1000 * DF_DRIFT)  # a refresh: the corpus moved by DF_DRIFT
    conn.table["film"] = 125
    assert await dfs.of(db, ["film"]) == {"film": 120}  # still within the drift
    dfs.chunks += 1  # beyond it: counted again
    assert await dfs.of(db, ["film", "nolan"]) == {"film": 125, "nolan": 3}
    assert conn.asked[-1] == ["film", "nolan"]
    assert await dfs.of(db, ["film"]) == {"film": 125}
    assert len(conn.asked) == 3


async def test_statistics_refresh_keeps_the_document_frequencies() -> None:
    conn = _StatsConn(chunks=500)
    cache = StatsCache(ttl_s=0.0)
    first = await cache.get(cast(AsyncConnection, conn))
    first.frequencies.known["film"] = (7, 500)
    conn.chunks = 501
    second = await cache.get(cast(AsyncConnection, conn))
    assert second.chunks == 501
    assert second.frequencies is first.frequencies
    assert second.frequencies.chunks == 501


class _StatsConn:
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    async def execute(self, _statement: object) -> Any:
        row = (self.chunks, 4.0)
        return type("Result", (), {"one": lambda _self: row})()


def test_history_not_kept_is_a_422_that_says_from_when() -> None:
    asked, since = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 6, 1, tzinfo=UTC)
    problem = as_problem(HistoryNotKept(asked, since))
    assert problem is not None
    assert (problem.status, problem.title) == (422, "History not kept")
    assert problem.extra == {"kept_since": "2024-06-01T00:00:00+00:00"}
    assert "history is kept from 2024-06-01" in problem.detail
    off = as_problem(HistoryNotKept(asked, None))
    assert off is not None
    assert "KGSTREAM_HISTORY_DAYS=0" in off.detail


def test_the_client_sends_as_of_as_iso_text() -> None:
    call = client_query("q", as_of=datetime(2024, 3, 1, 12, tzinfo=UTC))
    assert call.json is not None
    assert call.json["as_of"] == "2024-03-01T12:00:00+00:00"
    assert "as_of" not in (client_query("q").json or {})
