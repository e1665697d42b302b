"""Multi-step retrieval with an LLM (optional; IRCoT-style): after local mode's retrieval the
LLM reads the question and the top passages and names the one fact still missing as a short
search query (followup.py: the prompt and the reply's parsing); local retrieval runs for that
query and its ranking is fused with what was found by reciprocal rank; this repeats while the
LLM names a new query, at most ``steps`` times. Each search reads its own snapshot
transaction (``search``), so no transaction is held while the model answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.query_api import followup
from services.query_api.answer_span import TOP_CONTEXTS
from services.query_api.llm import Blocking, ChatModel, ChatReply
from services.query_api.retrieval import Retrieval


class Search(Protocol):
    """Local retrieval for a follow-up query, in its own snapshot transaction."""

    async def __call__(self, query: str) -> Retrieval:
        """What local mode finds for ``query``."""
        ...


@dataclass(frozen=True)
class FollowUps:
    """The follow-up loop's model and knobs (settings KGSTREAM_QUERY_LOCAL_FOLLOWUPS and the
    query's RRF constant)."""

    llm: ChatModel
    steps: int  # follow-up searches at most
    rrf_k: int
    blocking: Blocking  # runs the model call off the event loop

    async def run(
        self,
        question: str,
        result: Retrieval,
        k: int,
        *,
        search: Search,
        count: Callable[[ChatReply], None],
    ) -> list[str]:
        """Follow up on ``result`` in place (its contexts become the fused ranking of the k
        best); returns the queries searched. ``count`` is told of every completion. A failed
        LLM call keeps what was found and says so in the notes."""
        rankings, asked = [result.contexts], list[str]()
        for _ in range(self.steps):
            top = result.contexts[:TOP_CONTEXTS]
            try:
                reply = await self.blocking(
                    followup.ask_followup, self.llm, question, top, list(asked)
                )
            except Exception as exc:  # noqa: BLE001 - the retrieval so far still stands
                result.notes.append(f"LLM follow-up failed ({type(exc).__name__})")
                break
            count(reply)
            query = followup.next_query(reply, question, asked)
            if query is None:
                break
            asked.append(query)
            found = await search(query)
            rankings.append(found.contexts)
            result.contexts = followup.merge_rankings(rankings, k, self.rrf_k)
        if asked:
            result.notes.append("follow-up searches: " + "; ".join(asked))
        return asked
