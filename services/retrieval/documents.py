"""Reading one stored document as a caller may see it: its row and its text, rebuilt from the
chunks the indexer stored (chunks may overlap; each holds ``text[start_char:end_char]`` of the
document as indexed, which is its title, a blank line and its text: indexer/compute.py
``document_text``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval.visibility import DOC_VISIBLE, params

_ROW = (
    "SELECT d.doc_id, d.title, d.version, d.occurred_at, d.metadata, d.tenant, d.acl"
    " FROM documents d WHERE d.doc_id = :doc_id AND NOT d.deleted"
)
_CHUNKS = "SELECT start_char, end_char, text FROM chunks WHERE doc_id = :doc_id ORDER BY ord"


class DocumentRead(BaseModel):
    """A live document as indexed."""

    doc_id: str
    title: str
    version: int | None = None
    occurred_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)
    text: str = Field(description="The text as published, rebuilt from the stored chunks.")
    chunks: int = Field(description="How many chunks the text was indexed as.")
    tenant: str | None = Field(default=None, description="Admin callers only.")
    acl: list[str] | None = Field(default=None, description="Admin callers only.")


async def read_document(conn: AsyncConnection, doc_id: str, caller: Caller) -> DocumentRead | None:
    """The live document ``doc_id`` if the caller can see it, else None."""
    sql, values = _ROW, dict[str, object](doc_id=doc_id)
    if not caller.unfiltered:
        sql, values = f"{_ROW} AND {DOC_VISIBLE}", {**values, **params(caller)}
    row = (await conn.execute(text(sql), values)).first()
    if row is None:
        return None
    chunks = (await conn.execute(text(_CHUNKS), {"doc_id": doc_id})).all()
    return DocumentRead(
        doc_id=row.doc_id,
        title=row.title,
        version=row.version,
        occurred_at=row.occurred_at,
        metadata=row.metadata or {},
        text=_without_title(
            row.title, stitch([(c.start_char, c.end_char, c.text) for c in chunks])
        ),
        chunks=len(chunks),
        tenant=row.tenant if caller.admin else None,
        acl=list(row.acl) if caller.admin and row.acl is not None else None,
    )


def stitch(chunks: list[tuple[int, int, str]]) -> str:
    """The text the chunks (start, end, text) were cut from, in order: each chunk adds what
    lies past the end of the ones before it. A gap between chunks (nothing should leave one)
    is kept as one space, so words do not run together."""
    parts: list[str] = []
    covered = 0
    for start, end, body in chunks:
        if end <= covered:
            continue
        if start > covered and parts:
            parts.append(" ")
        parts.append(body[max(0, covered - start) :])
        covered = end
    return "".join(parts)


def _without_title(title: str, indexed: str) -> str:
    """The published text: the indexed text without the title that leads it."""
    lead = f"{title}\n\n"
    return indexed[len(lead) :] if title and indexed.startswith(lead) else indexed
