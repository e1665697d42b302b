"""One exception hierarchy. Two kinds matter to the pipeline: transient (retry) and permanent
(dead-letter with a reason)."""

from __future__ import annotations

from typing import Literal

DeadLetterReason = Literal[
    "invalid_json",
    "contract_violation",
    "oversize",
    "undecodable",
    "undecodable_batch",
    "extraction_failed",
    "processing_failed",
    "retries_exhausted",
]


class KgstreamError(Exception):
    """Base class of every error kgstream raises on purpose."""


class ConfigurationError(KgstreamError):
    """The settings or the environment cannot work (e.g. embedding width mismatch)."""


class TransientError(KgstreamError):
    """Worth retrying: the same input may succeed later (timeouts, 429, 5xx, lost connection)."""


class StaleComputeError(TransientError):
    """The state an event's compute phase planned against has moved (its document changed, a
    new merge candidate appeared): compute it again now, no backoff needed the first time."""


class PermanentError(KgstreamError):
    """Retrying cannot help; the event goes to the dead-letter topic with this reason."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: DeadLetterReason = reason
        self.detail = detail
