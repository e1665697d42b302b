"""The follow-up step's reply parsing and ranking merge (pure)."""

from __future__ import annotations

import json

import pytest

from services.retrieval.followup import MAX_QUERY_CHARS, merge_rankings, next_query
from services.retrieval.llm import ChatReply
from services.retrieval.schemas import Context


def reply(content: object) -> ChatReply:
    text = content if isinstance(content, str) else json.dumps(content)
    return ChatReply(content=text, prompt_tokens=10, completion_tokens=5, model="m")


def ctx(chunk: int) -> Context:
    return Context(doc_id=f"d{chunk}", chunk_id=chunk, title="", text=f"t{chunk}", score=0.0)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            {"answerable": False, "query": "  Maximum   Overdrive director "},
            "Maximum Overdrive director",
        ),
        ({"answerable": True, "query": "ignored"}, None),  # enough already
        ({"answerable": False}, None),  # nothing to search for
        ({"answerable": False, "query": ""}, None),
        ({"answerable": "no", "query": "x"}, None),  # not the JSON asked for
        ("not json", None),
        (["a list"], None),
        ({"answerable": False, "query": "who directed it?"}, None),  # the question again
        ({"answerable": False, "query": "Stephen  KING"}, None),  # an earlier query again
    ],
)
def test_next_query(content: object, expected: str | None) -> None:
    assert next_query(reply(content), "Who directed it?", ["Stephen King"]) == expected


def test_next_query_is_bounded() -> None:
    query = next_query(reply({"answerable": False, "query": "x" * 1000}), "q", [])
    assert query is not None
    assert len(query) == MAX_QUERY_CHARS


def test_merge_rankings_by_reciprocal_rank() -> None:
    first = [ctx(1), ctx(2), ctx(3)]
    second = [ctx(4), ctx(2)]
    merged = merge_rankings([first, second], k=3, rrf_k=60)
    # 2 is in both (1/62 + 1/62), then 1 and 4 tie at 1/61 and keep the first ranking's order
    assert [c.chunk_id for c in merged] == [2, 1, 4]
    assert merged[0].score == round(2 / 62, 6)
    assert merge_rankings([first], k=10, rrf_k=60) == [
        c.model_copy(update={"score": round(1 / (60 + r), 6)}) for r, c in enumerate(first, 1)
    ]
