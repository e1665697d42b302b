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

# What the database says decides, not the driver's class: psycopg files "program limit
# exceeded" (54xxx: an index row over btree's 2,704 bytes, a statement too complex) under
# OperationalError with lost connections, and calling it transient retried one event forever
# while its partition waited (issue 30). Transient: 40xxx serialization failure and deadlock,
# 08xxx connection, 53xxx insufficient resources (disk full, out of memory, too many
# connections), 57P0x admin/crash shutdown and 57014 statement timeout, 55P03 lock not
# available, 55006 object in use, 58000/58030 system and I/O errors. Every other SQLSTATE
# (data, integrity, syntax, limits, ...) is permanent: the same statement fails the same way.
_TRANSIENT_SQLSTATES = ("40", "08", "53", "57P", "57014", "55P03", "55006", "58000", "58030")


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
        if exc.connection_invalidated:
            return True
        sqlstate = sqlstate_of(exc)
        if sqlstate:
            return sqlstate.startswith(_TRANSIENT_SQLSTATES)
        # No SQLSTATE: the server never answered (a connection lost or refused).
        return isinstance(exc, OperationalError)
    if isinstance(exc, kafka.errors.KafkaError | aiokafka.errors.KafkaError):
        return bool(getattr(exc, "retriable", False)) or isinstance(
            exc,
            kafka.errors.KafkaTimeoutError
            | kafka.errors.KafkaConnectionError
            | aiokafka.errors.KafkaTimeoutError
            | aiokafka.errors.KafkaConnectionError,
        )
    return False


def sqlstate_of(exc: BaseException) -> str:
    """The SQLSTATE the server answered with, or "" when there is none (no answer, or not a
    database error)."""
    return str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")


def is_database_refusal(exc: BaseException) -> bool:
    """True when the database answered this statement with an error of its own (a SQLSTATE
    outside the connection and shutdown classes): the server is there, the statement is what
    fails. The indexer bounds its retries of such an event (services/indexer/handlers.py)."""
    sqlstate = sqlstate_of(exc)
    return (
        isinstance(exc, DBAPIError)
        and not exc.connection_invalidated
        and bool(sqlstate)
        and not sqlstate.startswith(("08", "57P"))
    )


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
