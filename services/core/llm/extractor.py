"""Entity and relationship extraction by an LLM (GraphRAG style): one structured-output chat
completion per chunk, plus optional gleaning passes that ask for what the first one missed."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
from openai.types.chat import ChatCompletionMessageParam
from openai.types.completion_usage import CompletionUsage
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, ValidationError

from services.core.errors import KgstreamError, PermanentError
from services.core.extraction import (
    ExtractedEntity,
    ExtractedRelation,
    Extraction,
    Extractor,
    StatedTime,
    TokenUsage,
)
from services.core.failures import is_transient
from services.core.llm.client import call_with_retries
from services.core.llm.prompts import document, with_data_rule
from services.core.time_spans import parse_span, stated_spans

SYSTEM_PROMPT = with_data_rule("""\
You build a knowledge graph from the text of the document the user sends.
1. Identify the entities the text names: people, organizations, locations, events, works,
   products and the key concepts it is about. For each entity give
   - name: exactly as written in the text,
   - type: one short upper-case category such as PERSON, ORGANIZATION, LOCATION, EVENT,
     WORK, PRODUCT or CONCEPT,
   - description: one sentence about the entity, using only the text.
2. Identify the relationships between those entities that the text states or clearly
   implies. For each give
   - source and target: names from your entity list,
   - type: a short upper-case verb phrase such as WORKS_AT, BORN_IN, DIRECTED, PART_OF,
   - description: one sentence explaining the relationship, using only the text,
   - strength: an integer from 1 (weak, incidental) to 10 (explicit and central),
   - valid_from and valid_to: when the relationship held, as the text states it (a date, a
     month or a year, e.g. "2 March 1911", "1911-03", "1911"); "" for a side the text does
     not give.
Use only information in the text. Reply with JSON that matches the schema.""")

GLEANING_PROMPT = (
    "Some entities and relationships may have been missed in the last extraction. "
    "Add them now, in the same JSON format, listing only the ones not given before "
    "(empty lists if nothing was missed)."
)

DEFAULT_ENTITY_TYPE = "MISC"
DEFAULT_RELATION_TYPE = "RELATED_TO"

_ENTITY_SCHEMA: dict[str, object] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "type", "description"],
    "properties": {
        "name": {"type": "string"},
        "type": {"type": "string"},
        "description": {"type": "string"},
    },
}
_RELATIONSHIP_SCHEMA: dict[str, object] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["source", "target", "type", "description", "strength", "valid_from", "valid_to"],
    "properties": {
        "source": {"type": "string"},
        "target": {"type": "string"},
        "type": {"type": "string"},
        "description": {"type": "string"},
        "strength": {"type": "integer", "minimum": 1, "maximum": 10},
        "valid_from": {"type": "string"},
        "valid_to": {"type": "string"},
    },
}
OUTPUT_SCHEMA: dict[str, object] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["entities", "relationships"],
    "properties": {
        "entities": {"type": "array", "items": _ENTITY_SCHEMA},
        "relationships": {"type": "array", "items": _RELATIONSHIP_SCHEMA},
    },
}
RESPONSE_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "knowledge_graph_extraction", "strict": True, "schema": OUTPUT_SCHEMA},
}

_TYPE_SEPARATORS = re.compile(r"[^0-9A-Za-z]+")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class MalformedOutputError(KgstreamError):
    """The model answered, but not with JSON of the requested shape."""


# Lenient on purpose where leniency is harmless (missing descriptions, strength as a float):
# only a wrong overall shape counts as malformed and costs an attempt.
class _Entity(BaseModel):
    name: str
    type: str = ""
    description: str = ""


class _Relationship(BaseModel):
    source: str
    target: str
    type: str = ""
    description: str = ""
    strength: float = 5.0
    valid_from: str = ""
    valid_to: str = ""


class _Output(BaseModel):
    entities: list[_Entity]
    relationships: list[_Relationship]


@dataclass
class _UsageTally:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def add(self, usage: CompletionUsage | None) -> None:
        self.calls += 1
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens


class OpenAIExtractor(Extractor):
    """Extractor over an OpenAI-compatible chat endpoint with structured outputs.

    Raises TransientError when the endpoint stays unavailable (the event is retried later)
    and PermanentError("extraction_failed") when it keeps answering with unusable content or
    rejects the request.
    """

    def __init__(
        self,
        client: openai.OpenAI,
        model: str,
        *,
        max_attempts: int = 4,
        concurrency: int = 4,
        gleanings: int = 0,
        base_delay: float = 0.5,
    ) -> None:
        if max_attempts < 1 or concurrency < 1 or gleanings < 0:
            raise ValueError("max_attempts and concurrency must be >= 1, gleanings >= 0")
        self._client = client
        self.model = model
        self.name = f"openai:{model}"
        self.max_attempts = max_attempts
        self.concurrency = concurrency
        self.gleanings = gleanings
        self.base_delay = base_delay

    def extract(self, texts: Sequence[str]) -> list[Extraction]:
        """One Extraction per text, in input order; chunks run ``concurrency`` at a time."""
        if len(texts) <= 1 or self.concurrency == 1:
            return [self._extract_one(t) for t in texts]
        pool = ThreadPoolExecutor(
            max_workers=min(self.concurrency, len(texts)), thread_name_prefix="llm-extract"
        )
        try:
            futures = [pool.submit(self._extract_one, t) for t in texts]
            return [f.result() for f in futures]
        finally:
            # After a failure the event is retried or dead-lettered as a whole: skip the rest.
            pool.shutdown(wait=True, cancel_futures=True)

    def _extract_one(self, text: str) -> Extraction:
        tally = _UsageTally()
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": document(text)},
        ]
        content, output = self._complete(messages, tally)
        outputs = [output]
        for _ in range(self.gleanings):
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": GLEANING_PROMPT})
            content, output = self._complete(messages, tally)
            outputs.append(output)
            if not output.entities and not output.relationships:
                break  # nothing missed: further passes would only cost tokens
        usage = TokenUsage(self.model, tally.prompt_tokens, tally.completion_tokens, tally.calls)
        return _to_extraction(text, outputs, usage)

    def _complete(
        self, messages: list[ChatCompletionMessageParam], tally: _UsageTally
    ) -> tuple[str, _Output]:
        def once() -> tuple[str, _Output]:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=list(messages),
                temperature=0,
                response_format=RESPONSE_FORMAT,
            )
            # Counted before parsing: a malformed answer was still paid for.
            tally.add(response.usage)
            content = response.choices[0].message.content if response.choices else None
            return content or "", _parse_output(content)

        try:
            return call_with_retries(once, self.max_attempts, self.base_delay, retryable=_retryable)
        except MalformedOutputError as exc:
            raise PermanentError(
                "extraction_failed",
                f"{self.model} gave unusable output {self.max_attempts} times: {exc}",
            ) from exc
        except openai.APIStatusError as exc:
            # Transient statuses became TransientError inside call_with_retries.
            raise PermanentError(
                "extraction_failed", f"{self.model} rejected the request: {exc.status_code} {exc}"
            ) from exc


def _retryable(exc: BaseException) -> bool:
    return is_transient(exc) or isinstance(exc, MalformedOutputError)


def _parse_output(content: str | None) -> _Output:
    if not content or not content.strip():
        raise MalformedOutputError("empty content (refusal or no answer)")
    body = content.strip()
    fenced = _FENCE.match(body)
    if fenced:  # some OpenAI-compatible servers wrap JSON in a Markdown fence anyway
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedOutputError(f"not JSON ({exc.msg}): {body[:80]!r}") from exc
    try:
        return _Output.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise MalformedOutputError(f"schema violation at {where}: {first['msg']}") from exc


def _to_extraction(text: str, outputs: Sequence[_Output], usage: TokenUsage | None) -> Extraction:
    # First spelling of an entity wins; a relationship needs both ends among the entities.
    entities: dict[str, ExtractedEntity] = {}
    for out in outputs:
        for ent in out.entities:
            name = _clean(ent.name)
            if not name or name.casefold() in entities:
                continue
            start, end = _locate(text, name)
            entities[name.casefold()] = ExtractedEntity(
                name=name,
                type=_type(ent.type, DEFAULT_ENTITY_TYPE),
                start=start,
                end=end,
                sentence=ent.description.strip(),
            )
    relations: dict[tuple[str, str, str], ExtractedRelation] = {}
    # When facts held: the sides the model gives a relationship, else the times its
    # description (or an entity's) states, read as the offline extractor reads a sentence.
    times = [
        StatedTime(e.sentence, span) for e in entities.values() for span in stated_spans(e.sentence)
    ]
    for out in outputs:
        for rel in out.relationships:
            source = entities.get(_clean(rel.source).casefold())
            target = entities.get(_clean(rel.target).casefold())
            if source is None or target is None or source is target:
                continue
            rel_type = _type(rel.type, DEFAULT_RELATION_TYPE)
            strength = min(max(rel.strength, 1.0), 10.0) / 10.0
            key = (source.name, target.name, rel_type)
            current = relations.get(key)
            sentence = rel.description.strip()
            given = parse_span(rel.valid_from, rel.valid_to)
            spans = [given] if given is not None else stated_spans(sentence)
            times += [StatedTime(sentence, span) for span in spans]
            if current is None or strength > current.strength:
                relations[key] = ExtractedRelation(
                    source.name, target.name, rel_type, strength, sentence
                )
    kept = {r.sentence for r in relations.values()} | {e.sentence for e in entities.values()}
    # One time per sentence and span: the first words that state it.
    once: dict[tuple[str, object, object], StatedTime] = {}
    for t in times:
        if t.sentence in kept:
            once.setdefault((t.sentence, t.span.start, t.span.end), t)
    stated = list(once.values())
    return Extraction(list(entities.values()), list(relations.values()), usage, stated)


def _clean(name: str) -> str:
    return " ".join(name.split())


def _type(raw: str, default: str) -> str:
    words = [w for w in _TYPE_SEPARATORS.split(raw) if w]
    return "_".join(words).upper() if words else default


def _locate(text: str, name: str) -> tuple[int, int]:
    start = text.find(name)
    if start < 0:
        # Models often change the case ("the Eiffel tower"); lower() keeps offsets only when
        # it keeps the length, which it does outside a few special letters.
        lowered = text.lower()
        if len(lowered) == len(text):
            start = lowered.find(name.lower())
    return (start, start + len(name)) if start >= 0 else (-1, -1)
