"""The chat model behind answers, routing and global map-reduce: a small Protocol with one
OpenAI-compatible implementation (our retry policy, token usage counted per call)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import openai

from services.core.llm.client import call_with_retries

T = TypeVar("T")


@dataclass
class Usage:
    """Tokens spent by one request's LLM calls, in all and by purpose (route, followup,
    answer)."""

    prompt: int = 0
    completion: int = 0
    calls: int = 0
    by_purpose: dict[str, tuple[int, int]] = field(default_factory=dict)  # (calls, tokens)

    def add(self, reply: ChatReply, purpose: str) -> None:
        """Count one completion."""
        self.prompt += reply.prompt_tokens
        self.completion += reply.completion_tokens
        self.calls += 1
        calls, tokens = self.by_purpose.get(purpose, (0, 0))
        spent = reply.prompt_tokens + reply.completion_tokens
        self.by_purpose[purpose] = (calls + 1, tokens + spent)

    def to_dict(self) -> dict[str, int]:
        """For the response's ``tokens`` field: prompt, completion and calls in all, then
        ``<purpose>_calls`` and ``<purpose>_tokens`` (prompt + completion) for each purpose
        that made a call."""
        out = {"prompt": self.prompt, "completion": self.completion, "calls": self.calls}
        for purpose, (calls, tokens) in sorted(self.by_purpose.items()):
            out[f"{purpose}_calls"], out[f"{purpose}_tokens"] = calls, tokens
        return out


@dataclass(frozen=True)
class ChatReply:
    """The assistant's content and what it cost."""

    content: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""  # the model that answered (for the model metrics)


class Blocking(Protocol):
    """Runs blocking model code off the event loop (the query service's executor)."""

    def __call__(self, fn: Callable[..., T], /, *args: object) -> Awaitable[T]:
        """``fn(*args)`` in the executor."""
        ...


class ChatModel(Protocol):
    """Blocking chat completion (callers run it in an executor)."""

    def complete(
        self, system: str, user: str, *, max_tokens: int, json_mode: bool = False
    ) -> ChatReply:
        """One completion."""
        ...


@dataclass(frozen=True)
class OpenAIChat:
    """ChatModel over an OpenAI-compatible endpoint."""

    client: openai.OpenAI
    model: str
    max_attempts: int = 4
    temperature: float = 0.0

    def complete(
        self, system: str, user: str, *, max_tokens: int, json_mode: bool = False
    ) -> ChatReply:
        """One completion, transient errors retried."""

        def call() -> ChatReply:
            resp = self.client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
                max_tokens=max_tokens,
                temperature=self.temperature,
                response_format={"type": "json_object"} if json_mode else openai.omit,
            )
            usage = resp.usage
            return ChatReply(
                content=resp.choices[0].message.content or "",
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                model=self.model,
            )

        return call_with_retries(call, self.max_attempts)
