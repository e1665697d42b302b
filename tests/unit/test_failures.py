"""Database failures are transient or permanent by their SQLSTATE, not by the driver's
exception class (issue 30, finding 1: psycopg files 54000 under OperationalError, next to lost
connections, and the indexer retried such an event forever)."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from sqlalchemy.exc import DBAPIError, OperationalError

from services.core.failures import is_database_refusal, is_transient


def answered(sqlstate: str) -> DBAPIError:
    """The error SQLAlchemy raises when the server answers ``sqlstate``."""
    orig = psycopg.errors.lookup(sqlstate)("injected")
    exc = DBAPIError.instance("SELECT 1", {}, orig, psycopg.Error)
    assert isinstance(exc, DBAPIError)
    return exc


TRANSIENT = ["40001", "40P01", "08006", "53100", "53200", "53300", "57P01", "57014", "55P03"]
PERMANENT = ["54000", "54001", "22001", "22P02", "23505", "42P01", "0A000", "XX000", "55000"]


@pytest.mark.parametrize("sqlstate", TRANSIENT)
def test_transient_sqlstates(sqlstate: str) -> None:
    assert is_transient(answered(sqlstate))


@pytest.mark.parametrize("sqlstate", PERMANENT)
def test_permanent_sqlstates_whatever_the_class(sqlstate: str) -> None:
    exc = answered(sqlstate)
    assert not is_transient(exc), type(exc).__name__


def test_program_limit_is_an_operational_error_and_still_permanent() -> None:
    exc = answered("54000")
    assert isinstance(exc, OperationalError)
    assert not is_transient(exc)


def test_no_answer_is_transient() -> None:
    """A connection lost or refused carries no SQLSTATE: the server never answered."""
    lost = OperationalError("SELECT 1", {}, psycopg.OperationalError("connection lost"))
    assert is_transient(lost)
    assert not is_database_refusal(lost)


@pytest.mark.parametrize(
    ("sqlstate", "refusal"),
    [("53200", True), ("40001", True), ("57014", True), ("08006", False), ("57P01", False)],
)
def test_a_refusal_is_an_answer_from_a_server_that_is_up(sqlstate: str, refusal: bool) -> None:
    assert is_database_refusal(answered(sqlstate)) is refusal
