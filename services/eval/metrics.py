"""Retrieval and answer metrics (pure): recall@2/@5/@k, all-gold@k, MRR and the last gold
document's rank by doc_id, each hop's gold document's rank (when the question has a hop
decomposition), answer exact match / token F1 / containment (services/eval/answer_scores.py),
abstention and the majority baseline (services/eval/abstention.py), latency percentiles, and
the per-mode summary the eval command prints: overall, by question type, by number of gold
documents, by hop count, and per hop of each hop count.

Retrieval figures average over the questions that have gold documents (a "null" question has
none: nothing can be retrieved for it); answer figures over the answerable questions with a
reference; abstention over every question."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.eval.abstention import abstention_scores, majority
from services.eval.answer_scores import (
    best_over,
    contains,
    exact_items,
    exact_match,
    normalise,
    token_f1,
)


@dataclass(frozen=True)
class QuestionResult:
    """One question answered in one mode."""

    qid: str
    question_type: str
    ranked_doc_ids: list[str]  # deduplicated, rank order
    gold: frozenset[str]
    latency_ms: float
    mode_used: str = ""
    answer: str = ""
    references: tuple[str, ...] = ()  # the reference answer and its aliases
    llm_calls: int = 0  # chat completions the query made (routing, follow-ups, answer)
    llm_tokens: int = 0  # their prompt + completion tokens
    followup_tokens: int = 0  # of which the follow-up decisions' (services/retrieval/multistep.py)
    hop_gold: tuple[str, ...] = ()  # each hop's gold doc_id in hop order (last: the answer's)
    num_hops: int = 0  # the question's hop count when it states one
    unanswerable: bool = False  # the set says nothing answers it (services/eval/abstention.py)
    abstained: bool = False  # the answer says it does not know
    answer_set: Any = None  # an exact answer: a count, names, a comparison (answer_scores.py)

    @property
    def hops(self) -> int:
        """The hop count: the stated one, else the number of gold documents."""
        return self.num_hops or len(self.gold)


def dedupe(doc_ids: Iterable[str]) -> list[str]:
    """Doc ids in rank order, each once (a document's later chunks add nothing)."""
    return list(dict.fromkeys(doc_ids))


def recall_at(ranked: Sequence[str], gold: frozenset[str], k: int) -> float:
    """Share of the gold documents among the first k."""
    return len(gold & set(ranked[:k])) / len(gold) if gold else 0.0


def all_gold_at(ranked: Sequence[str], gold: frozenset[str], k: int) -> float:
    """1.0 when every gold document is among the first k (what a multi-hop answer needs)."""
    return 1.0 if gold and gold <= set(ranked[:k]) else 0.0


def last_gold_rank(ranked: Sequence[str], gold: frozenset[str], k: int) -> float:
    """Rank of the last gold document to appear, k + 1 when one is not in the first k: how
    far down a multi-hop question's later hops sit (finer than all-gold@k, which saturates)."""
    where = {doc: rank for rank, doc in enumerate(ranked[:k], start=1)}
    if not gold or not gold <= set(where):
        return float(k + 1)
    return float(max(where[g] for g in gold))


def hop_ranks(ranked: Sequence[str], hop_gold: Sequence[str], k: int) -> list[int | None]:
    """Rank of each hop's gold document among the first k, in hop order (None when absent)."""
    where = {doc: rank for rank, doc in enumerate(ranked[:k], start=1)}
    return [where.get(doc) for doc in hop_gold]


def hop_rank_summary(results: Sequence[QuestionResult], k: int) -> dict[str, list[dict[str, Any]]]:
    """{hop count: [{"hop", "in_k", "in_5", "mean_rank", "n"} per hop in order]} over the
    questions with a hop decomposition: the share whose hop-i gold document is in the first k
    and the first 5, and its mean rank (k + 1 when absent). Which hop is lost, not only that one
    is; questions without a decomposition (HotpotQA) have no hop order and are left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for h in sorted({len(r.hop_gold) for r in results if r.hop_gold}):
        group = [
            hop_ranks(r.ranked_doc_ids, r.hop_gold, k) for r in results if len(r.hop_gold) == h
        ]
        n = len(group)
        out[str(h)] = []
        for i in range(h):
            at = [ranks[i] or k + 1 for ranks in group]  # ranks start at 1: None -> k + 1
            out[str(h)].append(
                {
                    "hop": i + 1,
                    "in_k": round(sum(rank <= k for rank in at) / n, 4),
                    "in_5": round(sum(rank <= min(5, k) for rank in at) / n, 4),
                    "mean_rank": round(sum(at) / n, 4),
                    "n": n,
                }
            )
    return out


def reciprocal_rank(ranked: Sequence[str], gold: frozenset[str]) -> float:
    """1 / rank of the first gold document (0 when none was retrieved)."""
    for rank, doc in enumerate(ranked, start=1):
        if doc in gold:
            return 1.0 / rank
    return 0.0


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summarise(results: Sequence[QuestionResult], k: int) -> dict[str, Any]:
    """{"recall", "all_gold", "mrr", "p50_ms", "p99_ms", "n", "n_gold", "recall_at_2",
    "recall_at_5", "last_gold_rank", "answer_em", "answer_f1", "answer_contains", "n_answerable",
    "majority_answer", "majority_share", "yes_no_accuracy", "n_yes_no", abstention's figures,
    "llm_calls", "llm_tokens", "followup_tokens"} over the results ("recall" is recall@k; LLM
    calls and tokens per question: the cost, and the follow-ups' share of the tokens).
    Retrieval averages over the questions with gold documents, answers over the answerable ones
    with a reference (0 when there are none)."""
    n = len(results)

    def mean(xs: Iterable[float], over: int) -> float:
        return round(sum(xs) / over, 4) if over else 0.0

    latencies = [r.latency_ms for r in results]
    golden = [r for r in results if r.gold]
    g = len(golden)
    answered = [r for r in results if r.references and not r.unanswerable]
    yes_no = [r for r in answered if normalise(r.references[0]) in ("yes", "no")]
    top, top_share = majority(r.references[0] for r in answered)

    def answers(score: Callable[[str, str], float], over: Sequence[QuestionResult]) -> float:
        return mean((best_over(score, r.answer, r.references) for r in over), len(over))

    exact = [s for r in results if (s := exact_items(r.answer, r.answer_set)) is not None]
    return {
        "recall": mean((recall_at(r.ranked_doc_ids, r.gold, k) for r in golden), g),
        "all_gold": mean((all_gold_at(r.ranked_doc_ids, r.gold, k) for r in golden), g),
        "mrr": mean((reciprocal_rank(r.ranked_doc_ids, r.gold) for r in golden), g),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "n": n,
        "n_gold": g,
        "recall_at_2": mean((recall_at(r.ranked_doc_ids, r.gold, 2) for r in golden), g),
        "recall_at_5": mean((recall_at(r.ranked_doc_ids, r.gold, 5) for r in golden), g),
        "last_gold_rank": mean((last_gold_rank(r.ranked_doc_ids, r.gold, k) for r in golden), g),
        "answer_em": answers(exact_match, answered),
        "answer_f1": answers(token_f1, answered),
        "answer_contains": answers(contains, answered),
        "n_answerable": len(answered),
        "majority_answer": top,
        "majority_share": top_share,
        "yes_no_accuracy": answers(exact_match, yes_no),
        "n_yes_no": len(yes_no),
        **abstention_scores((r.unanswerable, r.abstained) for r in results),
        "llm_calls": mean((r.llm_calls for r in results), n),
        "llm_tokens": mean((r.llm_tokens for r in results), n),
        "followup_tokens": mean((r.followup_tokens for r in results), n),
        **exact_scores(exact),
    }


def exact_scores(scored: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Exact answers' mean precision, recall and F1 (F1 per question, then averaged), and
    how many had one; nothing when none did."""
    if not scored:
        return {}
    f1s = [2 * p * r / (p + r) if p + r else 0.0 for p, r in scored]
    n = len(scored)
    return {
        "exact_precision": round(sum(p for p, _ in scored) / n, 4),
        "exact_recall": round(sum(r for _, r in scored) / n, 4),
        "exact_f1": round(sum(f1s) / n, 4),
        "exact_right": round(sum(f == 1.0 for f in f1s) / n, 4),
        "n_exact": n,
    }


def question_row(r: QuestionResult, k: int) -> dict[str, Any]:
    """One question's result as a JSON row (`kgstream eval --details`)."""
    return {
        "qid": r.qid,
        "question_type": r.question_type,
        "mode_used": r.mode_used,
        "ranked_doc_ids": r.ranked_doc_ids,
        "gold_doc_ids": sorted(r.gold),
        "hops": r.hops,
        "hop_gold_doc_ids": list(r.hop_gold),
        "hop_ranks": hop_ranks(r.ranked_doc_ids, r.hop_gold, k),
        "all_gold": all_gold_at(r.ranked_doc_ids, r.gold, k),
        "recall": recall_at(r.ranked_doc_ids, r.gold, k),
        "answer": r.answer,
        "references": list(r.references),
        "answer_em": best_over(exact_match, r.answer, r.references),
        "answer_f1": round(best_over(token_f1, r.answer, r.references), 4),
        "answer_contains": best_over(contains, r.answer, r.references),
        "unanswerable": r.unanswerable,
        "abstained": r.abstained,
        "llm_calls": r.llm_calls,
        "llm_tokens": r.llm_tokens,
        "followup_tokens": r.followup_tokens,
        "latency_ms": round(r.latency_ms, 1),
        "answer_set": r.answer_set,
    }


def mode_report(results: Sequence[QuestionResult], k: int) -> dict[str, Any]:
    """{"overall": summary, "by_type": {question_type: summary}, "by_gold": {number of gold
    documents: summary}, "by_hops": {hop count: summary}, "hop_ranks": hop_rank_summary} for
    one mode."""
    types = sorted({r.question_type for r in results})
    golds = sorted({len(r.gold) for r in results})
    hops = sorted({r.hops for r in results})
    return {
        "overall": summarise(results, k),
        "by_type": {t: summarise([r for r in results if r.question_type == t], k) for t in types},
        "by_gold": {str(g): summarise([r for r in results if len(r.gold) == g], k) for g in golds},
        "by_hops": {str(h): summarise([r for r in results if r.hops == h], k) for h in hops},
        "hop_ranks": hop_rank_summary(results, k),
    }
