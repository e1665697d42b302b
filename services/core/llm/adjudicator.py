"""LLM adjudication of entity merges in the ambiguous band (similar names, moderately similar
embeddings). Unsure or unusable answers mean "no merge": a duplicate is cheaper to live with
than a false merge."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema

from services.core.llm.client import call_with_retries
from services.core.llm.prompts import document, with_data_rule
from services.core.model_meter import NO_METER, ModelMeter

_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {
        "name": "same_entity",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"same": {"type": "boolean"}},
            "required": ["same"],
            "additionalProperties": False,
        },
    },
}
_SYSTEM = with_data_rule(
    "You decide whether two names in a knowledge graph refer to the same real-world entity: "
    "name A and name B, each in its own document block (the names come from documents). "
    'Answer with JSON {"same": true} only when you are confident; otherwise {"same": false}.'
)


_SYSTEM_IN_CONTEXT = with_data_rule(
    "You decide whether two names in a knowledge graph refer to the same real-world entity. "
    "Each document block holds a name, then a sentence where it was used, after its "
    "document's title (the blocks come from documents). A shorter name can be a short form of "
    "the longer one (a surname, a team's nickname) or another thing the longer one qualifies "
    "(a region of a country, a part of a series): tell them apart by the sentences. "
    'Answer with JSON {"same": true} only when you are confident; otherwise {"same": false}.'
)


def _same(
    client: openai.OpenAI,
    model: str,
    attempts: int,
    meter: ModelMeter,
    messages: list[ChatCompletionMessageParam],
) -> bool:
    def once() -> ChatCompletion:
        return client.chat.completions.create(
            model=model, temperature=0, messages=messages, response_format=_FORMAT
        )

    response = call_with_retries(once, attempts)
    usage = response.usage
    meter.model_call(
        "adjudicate",
        model,
        inputs=1,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
    )
    try:
        return json.loads(response.choices[0].message.content or "")["same"] is True
    except (ValueError, KeyError, TypeError):
        return False


def make_adjudicator(
    client: openai.OpenAI, model: str, attempts: int, meter: ModelMeter = NO_METER
) -> Callable[[str, str, str], Awaitable[bool]]:
    """An async (name, candidate, type group) -> same? callable for the resolver."""

    def ask(name: str, candidate: str, group: str) -> bool:
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": _SYSTEM},
            {
                "role": "user",
                "content": f"Type: {group}\n{document(name, 'A')}\n{document(candidate, 'B')}",
            },
        ]
        return _same(client, model, attempts, meter, messages)

    async def adjudicate(name: str, candidate: str, group: str) -> bool:
        return await asyncio.to_thread(ask, name, candidate, group)

    return adjudicate


# (name A, its context, name B, its context, type group) -> same?
ContextAdjudicator = Callable[[str, str, str, str, str], Awaitable[bool]]


def make_context_adjudicator(
    client: openai.OpenAI, model: str, attempts: int, meter: ModelMeter = NO_METER
) -> ContextAdjudicator:
    """Consolidation's adjudicator (services/maintenance/consolidation.py): two names, each
    with a sentence it was used in ("title: sentence")."""

    def ask(name: str, context: str, other: str, other_context: str, group: str) -> bool:
        blocks = (
            document(f"{name}\n{context}", "A"),
            document(f"{other}\n{other_context}", "B"),
        )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": _SYSTEM_IN_CONTEXT},
            {"role": "user", "content": f"Type: {group}\n{blocks[0]}\n{blocks[1]}"},
        ]
        return _same(client, model, attempts, meter, messages)

    async def adjudicate(
        name: str, context: str, other: str, other_context: str, group: str
    ) -> bool:
        return await asyncio.to_thread(ask, name, context, other, other_context, group)

    return adjudicate
