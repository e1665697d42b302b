"""Multi-step retrieval with an LLM (optional; IRCoT-style follow-ups on local mode's chains).

After local mode's retrieval the LLM reads the question and the top passages and names the one
fact still missing as a short search query (followup.py: the prompt and the reply's parsing).
That query is the condensed query of the next chain step (Baleen's, written by the model): it
is retrieved in local mode (its own grounding, embedding and walk), and that retrieval's chains
(chains.py) continue from the passages found so far instead of starting at its own best ones:
the top ``chain_width`` passages of the ranking so far are the chains' heads, relevance and the
question terms a step must add are the follow-up query's, and no step bridges through an entity
the question or an earlier search named, so the entity the query names is the next bridge. The
continued chains add only their later passages to the follow-up's ranking (the heads were
ranked by the earlier searches), interleaved with its own fused ranking as in a first search;
that ranking is fused with the rankings so far by reciprocal rank.
This repeats while the LLM names a new query, at most ``steps`` times. With chains off
(``chain_width`` 0) a follow-up is a plain local retrieval, fused the same way. Each search
reads its own snapshot transaction, so no transaction is held while the model answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.retrieval import followup
from services.retrieval.answer_span import TOP_CONTEXTS
from services.retrieval.chains import ChainStart
from services.retrieval.contexts import Retrieval
from services.retrieval.llm import Blocking, ChatModel, ChatReply


class Search(Protocol):
    """Local retrieval for a follow-up query, in its own snapshot transaction."""

    async def __call__(self, query: str, start: ChainStart | None) -> Retrieval:
        """What local mode finds for ``query``, its chains continuing from ``start``."""
        ...


@dataclass(frozen=True)
class FollowUps:
    """The follow-up loop's model and knobs (settings KGSTREAM_QUERY_LOCAL_FOLLOWUPS,
    KGSTREAM_QUERY_LOCAL_CHAIN_WIDTH and the query's RRF constant)."""

    llm: ChatModel
    steps: int  # follow-up searches at most
    rrf_k: int
    blocking: Blocking  # runs the model call off the event loop
    chain_width: int = 0  # passages found so far that the next search's chains continue from

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
        used = set(result.seeds)  # entities named so far: not bridges
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
            start = self.chain_start(result, used)
            found = await search(query, start)
            used.update(found.seeds)
            rankings.append(found.contexts)
            result.contexts = followup.merge_rankings(rankings, k, self.rrf_k)
            # the first search's best chain no longer describes the merged contexts
            result.chain = ()
        if asked:
            result.notes.append("follow-up searches: " + "; ".join(asked))
        return asked

    def chain_start(self, result: Retrieval, used: set[int]) -> ChainStart | None:
        """The next search's chains continue from the best ``chain_width`` passages so far
        (None: chains off, or nothing found)."""
        heads = tuple(c.chunk_id for c in result.contexts[: self.chain_width])
        return ChainStart(heads, frozenset(used)) if heads else None
