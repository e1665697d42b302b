"""Follow-up retrieval for local mode, IRCoT-style (optional; needs an LLM): after a retrieval
the LLM reads the question and the top passages and names the one fact still missing as a
short search query; local retrieval runs for that query and the rankings are merged by
reciprocal rank. The later hops of a question then need not share its words or names. Pure:
the prompt, the reply's parsing and the merge (the service runs the loop)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from services.core.llm.prompts import document, with_data_rule
from services.retrieval.answer import sources_prompt
from services.retrieval.lexical import rrf
from services.retrieval.llm import ChatModel, ChatReply
from services.retrieval.schemas import Context

FOLLOWUP_SYSTEM = with_data_rule(
    "You help answer a multi-hop question from retrieved passages (document blocks). Decide "
    "whether the passages already hold every fact the answer needs. If one is missing, write "
    "one short search query for the next fact to look up: name the entity the passages "
    "revealed (the bridge), not the question's own wording. Reply with JSON only: "
    '{"answerable": true} or {"answerable": false, "query": "..."}'
)
FOLLOWUP_MAX_TOKENS = 60  # one short query
MAX_QUERY_CHARS = 200


def ask_followup(
    llm: ChatModel, question: str, contexts: Sequence[Context], asked: Sequence[str]
) -> ChatReply:
    """One follow-up decision over the top contexts (blocking)."""
    prompt = sources_prompt(question, contexts)
    if asked:  # the earlier replies were written from the passages: data too
        prompt += "\n\nAlready searched for:\n" + document("; ".join(asked), "searched")
    return llm.complete(FOLLOWUP_SYSTEM, prompt, max_tokens=FOLLOWUP_MAX_TOKENS, json_mode=True)


def next_query(reply: ChatReply, question: str, asked: Sequence[str]) -> str | None:
    """The follow-up query the reply asks for; None when the passages suffice, the reply is
    not the JSON asked for, or the query repeats the question or an earlier one (a loop)."""
    try:
        data = json.loads(reply.content)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("answerable") is not False:
        return None
    query = data.get("query")
    if not isinstance(query, str) or not query.strip():
        return None
    query = " ".join(query.split())[:MAX_QUERY_CHARS]
    seen = {" ".join(q.lower().split()) for q in (question, *asked)}
    return None if query.lower() in seen else query


def merge_rankings(rankings: Sequence[Sequence[Context]], k: int, rrf_k: int) -> list[Context]:
    """The k best contexts by reciprocal rank fusion over the rankings (each context once,
    scored by its fused value; ties keep the earlier ranking's order)."""
    by_chunk: dict[int, Context] = {}
    for ranking in rankings:
        for c in ranking:
            by_chunk.setdefault(c.chunk_id, c)
    fused = rrf([[c.chunk_id for c in ranking] for ranking in rankings], rrf_k)
    order = sorted(by_chunk, key=lambda c: -fused[c])  # stable: first-seen order breaks ties
    return [by_chunk[c].model_copy(update={"score": round(fused[c], 6)}) for c in order[:k]]
