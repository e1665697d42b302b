"""The LLM follow-up loop (services/retrieval/multistep.py) over a scripted model and search:
each follow-up search continues the chains from the passages found so far, and what the
follow-ups cost is reported in the response's tokens and by `kgstream eval`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from services.cli.evaluate import table
from services.eval.metrics import QuestionResult, mode_report
from services.retrieval.chains import ChainStart
from services.retrieval.contexts import Retrieval
from services.retrieval.followup import FOLLOWUP_MAX_TOKENS, FOLLOWUP_SYSTEM
from services.retrieval.llm import ChatReply, Usage
from services.retrieval.multistep import FollowUps
from services.retrieval.schemas import Context

T = TypeVar("T")


def ctx(chunk: int) -> Context:
    return Context(doc_id=f"d{chunk}", chunk_id=chunk, title="", text=f"t{chunk}", score=0.0)


class ScriptedLLM:
    """Replies in turn with the follow-up decisions given (an exception is raised)."""

    def __init__(self, *decisions: dict[str, Any] | Exception) -> None:
        self.decisions = list(decisions)
        self.prompts: list[str] = []

    def complete(
        self, system: str, user: str, *, max_tokens: int, json_mode: bool = False
    ) -> ChatReply:
        assert (system, max_tokens, json_mode) == (FOLLOWUP_SYSTEM, FOLLOWUP_MAX_TOKENS, True)
        self.prompts.append(user)
        decision = self.decisions.pop(0)
        if isinstance(decision, Exception):
            raise decision
        return ChatReply(json.dumps(decision), prompt_tokens=100, completion_tokens=10)


async def inline(fn: Callable[..., T], /, *args: object) -> T:
    return fn(*args)


class Searches:
    """Local retrieval by query, recording each search's chain start."""

    def __init__(self, found: dict[str, tuple[list[int], list[int]]]) -> None:
        self.found = found  # query -> (ranked chunks, grounded seeds)
        self.calls: list[tuple[str, ChainStart | None]] = []

    async def __call__(self, query: str, start: ChainStart | None) -> Retrieval:
        self.calls.append((query, start))
        chunks, seeds = self.found[query]
        return Retrieval("local", [ctx(c) for c in chunks], seeds=seeds)


def ask(query: str) -> dict[str, Any]:
    return {"answerable": False, "query": query}


async def test_each_follow_up_continues_the_chains_from_what_was_found() -> None:
    llm = ScriptedLLM(ask("Maximum Overdrive"), ask("Stephen King"), {"answerable": True})
    search = Searches({"Maximum Overdrive": ([4, 1], [20]), "Stephen King": ([5, 4], [30])})
    result = Retrieval("local", [ctx(1), ctx(2), ctx(3)], seeds=[10])
    replies: list[ChatReply] = []
    loop = FollowUps(llm, steps=3, rrf_k=60, blocking=inline, chain_width=2)
    asked = await loop.run("Who directed it?", result, 4, search=search, count=replies.append)
    assert asked == ["Maximum Overdrive", "Stephen King"]
    # the first follow-up's chains start at the best 2 passages found, past the question's
    # seeds; the second's at the best 2 of the fused ranking, past the first follow-up's too
    assert search.calls == [
        ("Maximum Overdrive", ChainStart((1, 2), frozenset({10}))),
        ("Stephen King", ChainStart((1, 4), frozenset({10, 20}))),
    ]
    # reciprocal rank fusion of the three rankings: 1 (ranks 1, 2) and 4 (1, 2) tie and keep
    # the first-seen order, then 5 (1) and 2 (2)
    assert [c.chunk_id for c in result.contexts] == [1, 4, 5, 2]
    assert len(replies) == 3  # every decision is counted, also the last "answerable"
    assert "Already searched for:" in llm.prompts[2]  # the decisions see the earlier queries
    assert result.notes == ["follow-up searches: Maximum Overdrive; Stephen King"]


async def test_without_chains_a_follow_up_is_a_plain_search() -> None:
    search = Searches({"Maximum Overdrive": ([4], [20])})
    result = Retrieval("local", [ctx(1)], seeds=[10])
    loop = FollowUps(ScriptedLLM(ask("Maximum Overdrive"), {"answerable": True}), 2, 60, inline)
    await loop.run("Who directed it?", result, 2, search=search, count=lambda _: None)
    assert search.calls == [("Maximum Overdrive", None)]
    assert [c.chunk_id for c in result.contexts] == [1, 4]


async def test_a_failed_decision_keeps_what_was_found() -> None:
    search = Searches({})
    result = Retrieval("local", [ctx(1), ctx(2)], seeds=[10])
    loop = FollowUps(ScriptedLLM(RuntimeError("down")), 2, 60, inline, chain_width=3)
    assert await loop.run("q", result, 2, search=search, count=lambda _: None) == []
    assert search.calls == []
    assert [c.chunk_id for c in result.contexts] == [1, 2]
    assert result.notes == ["LLM follow-up failed (RuntimeError)"]


def test_usage_reports_tokens_by_purpose() -> None:
    usage = Usage()
    usage.add(ChatReply("", prompt_tokens=700, completion_tokens=20), "followup")
    usage.add(ChatReply("", prompt_tokens=600, completion_tokens=15), "followup")
    usage.add(ChatReply("", prompt_tokens=1500, completion_tokens=80), "answer")
    assert usage.to_dict() == {
        "prompt": 2800,
        "completion": 115,
        "calls": 3,
        "answer_calls": 1,
        "answer_tokens": 1580,
        "followup_calls": 2,
        "followup_tokens": 1335,
    }
    assert Usage().to_dict() == {"prompt": 0, "completion": 0, "calls": 0}


def test_eval_reports_the_follow_ups_tokens() -> None:
    gold = frozenset({"a"})
    results = [
        QuestionResult("1", "bridge", ["a"], gold, 1.0, llm_calls=3, llm_tokens=2900,
                       followup_tokens=1300),
        QuestionResult("2", "bridge", ["a"], gold, 1.0, llm_calls=2, llm_tokens=1900,
                       followup_tokens=700),
    ]  # fmt: skip
    report = mode_report(results, k=10)
    assert report["overall"]["followup_tokens"] == 1000.0
    lines = table({"k": 10, "modes": {"local": report}}).splitlines()
    assert (
        "local: 2.50 LLM calls and 2400 tokens (prompt + completion) per question, "
        "1000 of them in follow-up decisions"
    ) in lines
