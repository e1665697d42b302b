"""Pure helpers of bench/bench_incremental.py: which documents change (seeded), how a document's
text is edited (deterministically), the stub's answers per kind of chat request, the tally of the
stub's request log by kind, and the table of each phase's counts as fractions of the full build."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CAPITALISED_RUN = re.compile(r"\b[A-Z][\w'’-]*(?:[ \t]+[A-Z][\w'’-]*)*")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SYLLABLES = ("ka", "lo", "mi", "ru", "te", "vo", "zan", "qui", "bre", "dor", "fel", "nix")

# How the stub tells the chat requests apart: by their system prompt's first words.
KINDS = {
    "You build a knowledge graph": "extraction",
    "You write a report about one community": "summary",
    "You decide whether two names": "adjudication",
}


def choose(doc_ids: Sequence[str], count: int, seed: int, exclude: Iterable[str] = ()) -> list[str]:
    """``count`` distinct doc ids not in ``exclude``, the same for the same seed (sorted)."""
    skip = set(exclude)
    pool = sorted(d for d in doc_ids if d not in skip)
    if count > len(pool):
        raise ValueError(f"{count} documents wanted, {len(pool)} available")
    return sorted(random.Random(seed).sample(pool, count))


def reviewer(doc_id: str) -> str:
    """A capitalised made-up name unique to ``doc_id`` (a new entity of its edit)."""
    digest = hashlib.blake2b(doc_id.encode(), digest_size=8).digest()
    first = "".join(_SYLLABLES[b % len(_SYLLABLES)] for b in digest[:3]).capitalize()
    last = "".join(_SYLLABLES[b % len(_SYLLABLES)] for b in digest[3:6]).capitalize()
    return f"{first} {last}"


def edit_text(text: str, doc_id: str) -> str:
    """The edited text: the last sentence dropped (when there are two or more), and a sentence
    linking the document's first capitalised name to a new name unique to the document."""
    sentences = [s for s in _SENTENCE_END.split(text.strip()) if s]
    kept = sentences[:-1] if len(sentences) > 1 else sentences
    first = _CAPITALISED_RUN.search(text)
    subject = first.group(0) if first else "The Article"
    return " ".join([*kept, f"{subject} was reviewed by {reviewer(doc_id)}."])


def edited_event(event: Mapping[str, Any], version: int) -> dict[str, Any]:
    """A new version of an upsert event with its text edited."""
    return {
        **event,
        "event_id": f"{event['doc_id']}@{version}",
        "version": version,
        "text": edit_text(str(event["text"]), str(event["doc_id"])),
    }


def delete_event(event: Mapping[str, Any], version: int) -> dict[str, Any]:
    """The delete of an upsert event's document."""
    return {
        "event_id": f"{event['doc_id']}@{version}-delete",
        "type": "delete",
        "doc_id": event["doc_id"],
        "version": version,
        "occurred_at": event["occurred_at"],
    }


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def chat_kind(body: Mapping[str, Any]) -> str:
    """extraction, gleaning (a follow-up turn of extraction), summary, adjudication or other."""
    messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
    system = next((_text(m) for m in messages if m.get("role") == "system"), "")
    kind = next((k for prefix, k in KINDS.items() if system.startswith(prefix)), "other")
    users = sum(1 for m in messages if m.get("role") == "user")
    return "gleaning" if kind == "extraction" and users > 1 else kind


def report_answer(body: Mapping[str, Any]) -> str:
    """A community report in the writer's schema, titled after the prompt's first entity."""
    prompt = next(_text(m) for m in body["messages"] if m.get("role") == "user")
    lines = prompt.splitlines()
    entity = next(
        (ln[2:].split(" | ")[0] for ln in lines if ln.startswith("- ") and " | " in ln), "?"
    )
    return json.dumps(
        {
            "title": f"About {entity}",
            "summary": lines[0],
            "findings": [{"summary": entity, "explanation": "its first entity"}],
            "rating": 5,
        }
    )


_LEVEL = re.compile(r"^Community \d+ \(level (\d+),")


def summary_levels(bodies: Iterable[Mapping[str, Any]]) -> dict[int, list[int]]:
    """Per hierarchy level (from the prompt's first line): [summary calls, prompt tokens]."""
    out: dict[int, list[int]] = {}
    for body in bodies:
        if chat_kind(body) != "summary":
            continue
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        user = next((_text(m) for m in messages if m.get("role") == "user"), "")
        match = _LEVEL.match(user)
        level = int(match.group(1)) if match else -1
        entry = out.setdefault(level, [0, 0])
        entry[0] += 1
        entry[1] += sum(tokens(_text(m)) + 4 for m in messages)
    return dict(sorted(out.items()))


def tokens(text: str) -> int:
    """The stub's token count (words and punctuation)."""
    return len(_TOKEN.findall(text))


@dataclass
class Tally:
    """Requests, inputs (texts embedded; 1 per chat call) and prompt tokens per kind."""

    calls: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, int] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, inputs: int, prompt_tokens: int) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.inputs[kind] = self.inputs.get(kind, 0) + inputs
        self.prompt_tokens[kind] = self.prompt_tokens.get(kind, 0) + prompt_tokens

    def llm_calls(self) -> int:
        """Chat completions of every kind."""
        return sum(n for kind, n in self.calls.items() if kind != "embedding")

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": dict(sorted(self.calls.items())),
            "inputs": dict(sorted(self.inputs.items())),
            "prompt_tokens": dict(sorted(self.prompt_tokens.items())),
            "llm_calls": self.llm_calls(),
            "llm_prompt_tokens": sum(
                n for kind, n in self.prompt_tokens.items() if kind != "embedding"
            ),
        }


def tally(requests: Iterable[tuple[str, Mapping[str, Any]]]) -> Tally:
    """Count (path, body) requests of the stub's log by kind; prompt tokens as the stub counts
    them (chat: each message's tokens + 4; embeddings: the inputs' tokens)."""
    out = Tally()
    for path, body in requests:
        if path.endswith("/embeddings"):
            raw = body.get("input", [])
            texts = [raw] if isinstance(raw, str) else [str(t) for t in raw]
            out.add("embedding", len(texts), sum(tokens(t) for t in texts))
        elif path.endswith("/chat/completions"):
            messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
            out.add(chat_kind(body), 1, sum(tokens(_text(m)) + 4 for m in messages))
        else:
            out.add("other", 0, 0)
    return out


@dataclass(frozen=True)
class Row:
    """One line of the fraction table: a measure, its full-build value, a phase's value, and
    the target fraction (None: no target)."""

    measure: str
    full: float
    phase: float
    target: float | None = None

    @property
    def fraction(self) -> float | None:
        return self.phase / self.full if self.full else None

    @property
    def met(self) -> bool | None:
        fraction = self.fraction
        if self.target is None or fraction is None:
            return None
        return fraction <= self.target


def phase_rows(
    full: Mapping[str, float], phase: Mapping[str, float], targets: Mapping[str, float]
) -> list[Row]:
    """A row per measure of ``full`` (in its order), with the target where there is one."""
    return [Row(name, full[name], phase.get(name, 0.0), targets.get(name)) for name in full]


def render(title: str, rows: Sequence[Row]) -> str:
    """The rows as an aligned text table: measure, full build, phase, fraction, target, met."""
    lines = [title, f"{'measure':<28}{'full':>12}{'phase':>12}{'fraction':>10}  target"]
    for row in rows:
        fraction = "-" if row.fraction is None else f"{row.fraction:.2%}"
        target = "" if row.target is None else f"<= {row.target:.0%}"
        verdict = {None: "", True: " met", False: " MISSED"}[row.met]
        lines.append(
            f"{row.measure:<28}{row.full:>12.6g}{row.phase:>12.6g}{fraction:>10}  {target}{verdict}"
        )
    return "\n".join(lines)
