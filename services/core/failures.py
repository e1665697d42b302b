"""Transient or permanent: the one predicate every retry loop and the indexer's error boundary
use. Transient means the same input may succeed later (lost connections, timeouts, 429, 5xx,
serialization failures, a broker that is not there yet), so the work is retried and never acked
before it succeeds; anything else is permanent and the event is dead-lettered with a reason."""

from __future__ import annotations

import aiokafka.errors
import kafka.errors
import openai
from sqlalchemy.exc import DBAPIError, OperationalError

from services.core.errors import PermanentError, TransientError

# 40001 serialization failure, 40P01 deadlock, 08xxx connection, 53xxx insufficient resources,
# 57P0x admin/crash shutdown, 55P03 lock not available.
_TRANSIENT_SQLSTATES = ("40", "08", "53", "57P", "55P03")


def is_transient(exc: BaseException) -> bool:  # noqa: PLR0911 - one return per family
    """True for failures worth retrying as they are; False means retrying cannot help."""
    if isinstance(exc, PermanentError):
        return False
    if isinstance(exc, TransientError | TimeoutError | ConnectionError):
        return True
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        # 408 is the server's own timeout report, so it is a timeout like ours.
        return exc.status_code in (408, 429) or exc.status_code >= 500
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, OperationalError):
            return True
        sqlstate = str(getattr(exc.orig, "sqlstate", None) or "")
        return sqlstate.startswith(_TRANSIENT_SQLSTATES)
    if isinstance(exc, kafka.errors.KafkaError | aiokafka.errors.KafkaError):
        return bool(getattr(exc, "retriable", False)) or isinstance(
            exc,
            kafka.errors.KafkaTimeoutError
            | kafka.errors.KafkaConnectionError
            | aiokafka.errors.KafkaTimeoutError
            | aiokafka.errors.KafkaConnectionError,
        )
    return False


def is_statement_timeout(exc: BaseException) -> bool:
    """True when the database cut a statement at statement_timeout (SQLSTATE 57014). Transient,
    but retrying under the same bound could cut it again forever: the indexer retries such an
    event with no bound (services/indexer/handlers.py)."""
    return isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) == "57014"


def as_permanent(exc: BaseException) -> PermanentError:
    """The dead-letter form of a failure: our own reason, or processing_failed with the
    exception's class and message."""
    if isinstance(exc, PermanentError):
        return exc
    orig = getattr(exc, "orig", None)  # SQLAlchemy wraps the driver's error
    inner = orig if isinstance(orig, BaseException) else exc
    return PermanentError("processing_failed", f"{type(inner).__name__}: {inner}")
