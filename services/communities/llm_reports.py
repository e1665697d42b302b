"""Community reports by an LLM (GraphRAG style) through an OpenAI-compatible endpoint: one
structured-output chat completion per community. A community with sub-communities is written
from its children's reports first, then from its own entities and relationships while the
level's token budget lasts; a leaf from its entities and relationships."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import openai
import tiktoken
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field, ValidationError

from services.communities.reports import Finding, Report, ReportInput, extractive_report
from services.core.chunking import ENCODING_NAME
from services.core.errors import KgstreamError
from services.core.failures import is_transient
from services.core.llm.client import call_with_retries
from services.core.llm.prompts import document, with_data_rule

log = logging.getLogger(__name__)

SYSTEM_PROMPT = with_data_rule("""\
You write a report about one community of a knowledge graph: a group of closely related
entities. From the entities, relationships and sub-community reports the user sends (in a
document block: their descriptions quote the documents), write
- title: a short, specific name for the community (its key entities),
- summary: an executive summary of the community's structure and what connects its entities,
- findings: 3 to 6 key insights, each a one-line summary and an explanation grounded only in
  the given data,
- rating: a number from 0 to 10, how important this community is for understanding the
  collection as a whole.
Use only the data given. Reply with JSON that matches the schema.""")

OUTPUT_SCHEMA: dict[str, object] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "summary", "findings", "rating"],
    "properties": {
        "title": {"type": "string"},
        "summary": {"type": "string"},
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["summary", "explanation"],
                "properties": {"summary": {"type": "string"}, "explanation": {"type": "string"}},
            },
        },
        "rating": {"type": "number"},
    },
}
RESPONSE_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "community_report", "strict": True, "schema": OUTPUT_SCHEMA},
}


class _Finding(BaseModel):
    summary: str
    explanation: str = ""


class _Output(BaseModel):
    title: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    findings: list[_Finding] = []
    rating: float = 5.0


class MalformedReportError(KgstreamError):
    """The model answered, but not with a report of the requested shape."""


class LLMReportWriter:
    """ReportWriter over an OpenAI-compatible chat endpoint (synchronous; threads inside)."""

    max_entities = 60
    max_relations = 60
    passages = 0  # the model reads the facts; the extractive themes are not computed for it

    def __init__(
        self,
        client: openai.OpenAI,
        model: str,
        *,
        input_tokens: Sequence[int] = (6000, 4000),
        output_tokens: int = 1200,
        max_attempts: int = 4,
        concurrency: int = 4,
        base_delay: float = 0.5,
    ) -> None:
        self._client = client
        self.model = model
        self.name = f"openai:{model}"
        self.input_tokens = tuple(input_tokens)
        self.output_tokens = output_tokens
        self.max_attempts = max_attempts
        self.concurrency = concurrency
        self.base_delay = base_delay
        self._encoding = tiktoken.get_encoding(ENCODING_NAME)

    def write(self, inputs: Sequence[ReportInput]) -> list[Report]:
        """One report per input, in order, ``concurrency`` calls at a time."""
        if len(inputs) <= 1 or self.concurrency == 1:
            return [self._one(item) for item in inputs]
        with ThreadPoolExecutor(
            max_workers=min(self.concurrency, len(inputs)), thread_name_prefix="llm-report"
        ) as pool:
            return list(pool.map(self._one, inputs))

    def budget(self, level: int) -> int:
        """The context token budget of a report at ``level``."""
        return self.input_tokens[min(level, len(self.input_tokens) - 1)]

    def context(self, item: ReportInput) -> str:
        """The user message: a header, then one document block with the children's reports
        first, then entities and relationships, cut at the level's token budget (whole lines
        only; the block's tags count too)."""
        header = f"Community {item.community_id} (level {item.level}, {item.size} entities)"
        block_id = f"community-{item.community_id}"
        sections = [
            (
                "Sub-community reports:",
                [f"- [{c.size}] {c.title}: {c.summary}" for c in item.children],
            ),
            (
                "Entities (name | type | description):",
                [f"- {e.name} | {e.type} | {e.description}" for e in item.entities],
            ),
            (
                "Relationships (source | type | target | weight | description):",
                [
                    f"- {r.source} | {r.type} | {r.target} | {r.weight:g} | {r.description}"
                    for r in item.relations
                ],
            ),
        ]
        budget = self.budget(item.level)
        kept: list[str] = []
        used = self._tokens(header) + self._tokens(document("", block_id))
        for title, lines in sections:
            if not lines:
                continue
            kept.append(("\n" if kept else "") + title)
            used += self._tokens(title)
            for line in lines:
                cost = self._tokens(line)
                if used + cost <= budget:  # skip what does not fit; shorter lines may still
                    kept.append(line)
                    used += cost
        body = "\n".join(kept)
        return f"{header}\n{document(body, block_id)}"

    def _tokens(self, line: str) -> int:
        return len(self._encoding.encode(line, disallowed_special=())) + 1

    def _one(self, item: ReportInput) -> Report:
        usage = [0, 0]

        def once() -> _Output:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": self.context(item)},
                ],
                temperature=0,
                max_tokens=self.output_tokens,
                response_format=RESPONSE_FORMAT,
            )
            if response.usage is not None:  # counted before parsing: a bad answer is paid for
                usage[0] += response.usage.prompt_tokens
                usage[1] += response.usage.completion_tokens
            content = response.choices[0].message.content if response.choices else None
            return _parse(content)

        try:
            out = call_with_retries(once, self.max_attempts, self.base_delay, retryable=_retryable)
        except MalformedReportError as exc:
            # Not a reason to fail the snapshot: this community gets an extractive report, and
            # since its writer differs it is asked for again at the next recompute.
            log.warning("community %s: unusable LLM report (%s)", item.community_id, exc)
            fallback = extractive_report(item)
            return Report(
                fallback.title,
                fallback.summary,
                fallback.findings,
                fallback.rating,
                fallback.writer,
                (usage[0], usage[1]),
            )
        return Report(
            title=out.title.strip(),
            summary=out.summary.strip(),
            findings=[Finding(f.summary.strip(), f.explanation.strip()) for f in out.findings],
            rating=min(max(out.rating, 0.0), 10.0),
            writer=self.name,
            usage=(usage[0], usage[1]),
        )


def _retryable(exc: BaseException) -> bool:
    return is_transient(exc) or isinstance(exc, MalformedReportError)


def _parse(content: str | None) -> _Output:
    body = (content or "").strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        return _Output.model_validate(json.loads(body))
    except json.JSONDecodeError as exc:
        raise MalformedReportError(f"not JSON ({exc.msg}): {body[:80]!r}") from exc
    except ValidationError as exc:
        raise MalformedReportError(f"schema violation: {exc.errors()[0]['msg']}") from exc
