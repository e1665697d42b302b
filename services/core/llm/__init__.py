"""LLM access through an OpenAI-compatible endpoint: the client, retries, the extractor."""

from services.core.failures import is_transient
from services.core.llm.client import call_with_retries, make_openai_client
from services.core.llm.extractor import OpenAIExtractor

__all__ = ["OpenAIExtractor", "call_with_retries", "is_transient", "make_openai_client"]
