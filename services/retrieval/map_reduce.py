"""Global mode's answer with an LLM (GraphRAG's global search): each community summary is
mapped to scored points in parallel, then the points are reduced to one answer citing their
communities. The prompts and the points' parsing are in answer.py; this module runs the calls.
With no point back, the offline themes answer stands."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from services.retrieval import answer as answers
from services.retrieval.llm import Blocking, ChatModel, ChatReply
from services.retrieval.schemas import CommunityHit

MAP_MAX_TOKENS = 400  # a few points from one summary
REDUCE_MAX_TOKENS = 600


async def map_reduce(
    llm: ChatModel,
    question: str,
    communities: Sequence[CommunityHit],
    *,
    blocking: Blocking,
    count: Callable[[ChatReply], None],
) -> str:
    """The answer to a global question from these communities' summaries; ``count`` is told
    of every completion (its tokens go to the request's usage)."""

    def map_one(community: CommunityHit) -> ChatReply:
        prompt = answers.map_prompt(question, community)
        return llm.complete(answers.MAP_SYSTEM, prompt, max_tokens=MAP_MAX_TOKENS, json_mode=True)

    replies = await asyncio.gather(*(blocking(map_one, c) for c in communities))
    points = []
    for community, reply in zip(communities, replies, strict=True):
        count(reply)
        points += answers.parse_points(reply, community.id)
    if not points:
        return answers.extractive_global_answer(communities)
    prompt = answers.reduce_prompt(question, points)
    reduce = functools.partial(llm.complete, max_tokens=REDUCE_MAX_TOKENS)
    reply = await blocking(reduce, answers.REDUCE_SYSTEM, prompt)
    count(reply)
    return reply.content.strip()
