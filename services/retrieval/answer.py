"""Answers. Offline: extractive, never invented: the span the question asks for
(services/retrieval/answer_span.py) with the sentence it was read from, else the best supporting
sentence quoted with its source. With an LLM: an answer synthesised from the numbered contexts,
citing them as [n]; for global questions a map-reduce over community summaries."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from services.core.llm.prompts import document, neutralise, with_data_rule
from services.retrieval.answer_span import Mention, answer_span
from services.retrieval.llm import ChatModel, ChatReply
from services.retrieval.schemas import CommunityHit, Context

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_TERM = re.compile(r"\w+")
NO_ANSWER = "No indexed passage matches this question yet."
DONT_KNOW = "I don't know"  # how an answer that abstains begins, offline and with an LLM
CONTEXT_CHARS = 1500

ANSWER_SYSTEM = with_data_rule(
    "Answer the question using only the numbered sources (document blocks; a source's number is "
    "its block's id). Cite every claim with the source number in square brackets, e.g. [1] or "
    f'[2][3]. If the sources do not contain the answer, begin with "{DONT_KNOW}" and say '
    "what they lack. Be brief."
)
MAP_SYSTEM = with_data_rule(
    "You are given one community report from a knowledge graph (a document block). Using only "
    'this report, answer the question as JSON {"points": [{"text": T, "score": S}]} where S '
    "(0-100) says how helpful the point is. Return no points if the report is irrelevant."
)
REDUCE_SYSTEM = with_data_rule(
    "Combine the analysts' points (a document block; each point tagged with its community in "
    "square brackets) into one answer to the question. Keep the community tags as citations. "
    "Use only these points."
)


def not_held(sources: Sequence[str]) -> str:
    """The answer to a question that attributes its facts to sources no document is from."""
    return f"{DONT_KNOW}: no document here is from {', '.join(sources)}."


def abstains(answer: str) -> bool:
    """Whether an answer says the passages do not answer (no passage, or nothing in them)."""
    return answer == NO_ANSWER or answer.startswith(DONT_KNOW)


def extractive(
    question: str,
    contexts: Sequence[Context],
    mentions: Sequence[Mention],
    chain: Sequence[int] = (),
) -> tuple[str, str]:
    """(answer, support): the span the question asks for, cited, with its sentence; else the
    best supporting sentence (and no separate support). ``chain``: local mode's best chain of
    passages (chunk ids in hop order), whose next hop a bridge answer moves to."""
    span = answer_span(question, contexts, mentions, chain)
    if span is None:
        return extractive_answer(question, contexts), ""
    return f"{span.text} [{span.doc_id}]", f"{span.sentence} [{span.doc_id}]"


def extractive_answer(question: str, contexts: Sequence[Context], top: int = 3) -> str:
    """The best supporting sentence from the top contexts, quoted with its source; sentences
    are scored by overlap with the question's terms, earlier contexts preferred."""
    terms = {t.lower() for t in _TERM.findall(question) if len(t) > 2}
    best: tuple[float, str, str] | None = None
    for rank, ctx in enumerate(contexts[:top]):
        for sentence in _SENTENCE.split(ctx.text):
            words = {w.lower() for w in _TERM.findall(sentence)}
            score = len(terms & words) - 0.5 * rank
            if sentence.strip() and (best is None or score > best[0]):
                best = (score, sentence.strip(), ctx.doc_id)
    if best is None:
        return NO_ANSWER
    return f"{best[1]} [{best[2]}]"


GLOBAL_THEMES = 5  # titles of the top communities (their themes) the offline global answer lists
GLOBAL_SUMMARIES = 3  # of which the first few have their summaries quoted as support


def extractive_global_answer(communities: Sequence[CommunityHit]) -> str:
    """Offline global answer: the themes (titles) of the top communities, numbered, each with
    the ids of the communities that have it, then the first ones' summaries as support."""
    shown = [c for c in communities if c.summary.strip()]
    if not shown:
        return NO_ANSWER
    # Communities read from the same passages can share a title: one theme, all their ids.
    by_title: dict[str, list[int]] = {}
    for c in shown:
        by_title.setdefault(c.title or "Community", []).append(c.id)
    themes = "; ".join(
        f"{n}) {title} [{'community' if len(ids) == 1 else 'communities'} "
        f"{', '.join(map(str, ids))}]"
        for n, (title, ids) in enumerate(list(by_title.items())[:GLOBAL_THEMES], 1)
    )
    lines = [f"The documents are mainly about: {themes}."]
    lines += [
        f"{c.title or 'Community'}: {c.summary.strip()} [community {c.id}]"
        for c in shown[:GLOBAL_SUMMARIES]
    ]
    return "\n".join(lines)


def sources_prompt(question: str, contexts: Sequence[Context]) -> str:
    """The user message: the sources as document blocks numbered by their ids, then the
    question."""
    parts = [
        document(f"{c.title} ({c.doc_id})\n{c.text[:CONTEXT_CHARS]}", i)
        for i, c in enumerate(contexts, 1)
    ]
    return "Sources:\n\n" + "\n\n".join(parts) + f"\n\nQuestion: {neutralise(question)}"


def synthesise(llm: ChatModel, question: str, contexts: Sequence[Context]) -> ChatReply:
    """LLM answer citing the numbered contexts (blocking)."""
    return llm.complete(ANSWER_SYSTEM, sources_prompt(question, contexts), max_tokens=500)


_CITED = re.compile(r"\[(\d+)\]")


def cited_sources(answer: str, contexts: Sequence[Context]) -> tuple[str, list[int]]:
    """("[1] doc-a; [3] doc-c", numbers that name no source) for an LLM answer's [n] citations:
    what the answer's support field lists, and what the notes flag."""
    numbers = sorted({int(n) for n in _CITED.findall(answer)})
    valid = [n for n in numbers if 1 <= n <= len(contexts)]
    listed = "; ".join(f"[{n}] {contexts[n - 1].doc_id}" for n in valid)
    return listed, [n for n in numbers if n not in valid]


def map_prompt(question: str, community: CommunityHit) -> str:
    """The map step's user message for one community: its report as a document block."""
    report = document(f"{community.title}\n{community.summary}", community.id)
    return f"Report [{community.id}]\n{report}\n\nQuestion: {neutralise(question)}"


def parse_points(reply: ChatReply, community_id: int) -> list[tuple[float, str]]:
    """(score, "point [community id]") pairs from a map reply; nothing when unparseable."""
    try:
        data = json.loads(reply.content)
    except json.JSONDecodeError:
        return []
    points = data.get("points", []) if isinstance(data, dict) else []
    out = []
    for p in points if isinstance(points, list) else []:
        if isinstance(p, dict) and str(p.get("text", "")).strip():
            try:
                score = float(p.get("score", 0))
            except (TypeError, ValueError):
                score = 0.0
            if score > 0:
                out.append((score, f"{str(p['text']).strip()} [{community_id}]"))
    return out


def reduce_prompt(question: str, points: Sequence[tuple[float, str]], limit: int = 30) -> str:
    """The reduce step's user message: the most helpful points first."""
    best = sorted(points, key=lambda p: -p[0])[:limit]
    listed = document("\n".join(f"- ({s:.0f}) {t}" for s, t in best), "points")
    return f"Points:\n{listed}\n\nQuestion: {neutralise(question)}"
