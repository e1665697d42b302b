"""The auto mode's router. Heuristics by default (pure, no I/O): path words with two named
things → path; theme words → global; relationship words or a named entity → local; else
vector. With an LLM configured, a classifier decides and the heuristic is the fallback; the
classifier also names the sources the question says its facts come from, which the service
grounds or finds missing against the documents' facets (services/retrieval/facets.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from services.retrieval.llm import ChatModel, ChatReply
from services.retrieval.schemas import Mode

_PATH = re.compile(
    r"\b(connect(?:ed|s|ion)?|link(?:ed|s)?|path|relat(?:ed|ion|ionship)s?\s+(?:between|to))\b"
    r"|\bhow\s+(?:is|are|was|were)\b.+\b(?:related|connected|linked)\b",
    re.IGNORECASE,
)
_THEMES = re.compile(
    r"\b(themes?|topics?|overall|overview|summar(?:y|ise|ize)|trends?|main\s+ideas?|"
    r"in\s+general|across\s+(?:the\s+)?(?:corpus|documents|collection)|"
    r"what\s+is\s+(?:this|the)\s+(?:corpus|collection)\s+about|big\s+picture)\b",
    re.IGNORECASE,
)
_RELATIONSHIP = re.compile(
    r"\b(who|which|whose|where)\b.+\b(of|by|for|in|with|from)\b|"
    r"\b(directed|founded|wrote|written|born|married|played|starred|created|produced|"
    r"owned|member|father|mother|son|daughter|wife|husband|brother|sister|based|located)\b",
    re.IGNORECASE,
)
_NAME = re.compile(r"(?<!^)(?<![.?!]\s)\b[A-Z][\w'’-]+")

ROUTER_SYSTEM = (
    'Route a question to a retrieval mode. Answer JSON {"mode": M, "reason": R, "sources": S} '
    "with M one of: vector (a fact in one passage), local (facts about named entities and "
    "their relations, multi-hop), global (themes or summaries across the whole collection), "
    "path (how two named entities are connected); and S the publications, outlets or authors "
    "the question says its facts come from, each as written in the question ([] if none)."
)
MAX_NAMED_SOURCES = 10
MAX_SOURCE_CHARS = 200


@dataclass(frozen=True)
class Route:
    """The chosen mode and why."""

    mode: Mode
    reason: str
    sources: tuple[str, ...] = ()  # the classifier's: where the question says facts come from


def names_something(question: str) -> bool:
    """A capitalised word that does not start the sentence (a proper name, most likely)."""
    return _NAME.search(question.strip()) is not None


def heuristic_route(question: str, *, has_communities: bool = True) -> Route:
    """Route by wording alone."""
    if _PATH.search(question) and len(_NAME.findall(question.strip())) >= 2:
        return Route("path", "asks how two named things are connected")
    if _THEMES.search(question) and has_communities:
        return Route("global", "asks about themes across the collection")
    if _RELATIONSHIP.search(question) or names_something(question):
        return Route("local", "names entities or asks about a relationship")
    return Route("vector", "no entity or relationship cue")


def parse_llm_route(reply: ChatReply) -> Route | None:
    """The classifier's mode, or None when its reply is unusable."""
    try:
        data = json.loads(reply.content)
    except json.JSONDecodeError:
        return None
    mode = data.get("mode") if isinstance(data, dict) else None
    if mode in ("vector", "local", "global", "path"):
        named = data.get("sources")
        sources = tuple(
            dict.fromkeys(
                n.strip()
                for n in (named if isinstance(named, list) else [])[:MAX_NAMED_SOURCES]
                if isinstance(n, str) and 0 < len(n.strip()) <= MAX_SOURCE_CHARS
            )
        )
        return Route(mode, f"LLM: {str(data.get('reason', ''))[:200]}", sources)
    return None


def llm_route(llm: ChatModel, question: str) -> tuple[Route | None, ChatReply | None]:
    """Ask the classifier (blocking); (None, reply) when it answered nonsense."""
    reply = llm.complete(ROUTER_SYSTEM, question, max_tokens=60, json_mode=True)
    return parse_llm_route(reply), reply
