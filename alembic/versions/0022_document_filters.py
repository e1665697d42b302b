"""Query filters on document metadata and time (issue 31): ``kgstream_doc_matches`` and an index
on ``documents.occurred_at``.

A query's ``filters`` narrow the documents it reads (services/retrieval/filters.py); every read
states them as one predicate over ``documents d`` next to the visibility predicate
(services/retrieval/visibility.py): ``occurred_at`` against two bound instants, and the
metadata conditions as one bound jsonb array evaluated by this function, so the statement text
stays a constant whatever the filter.

``conds`` is a JSON array of conditions, each on the metadata value at ``path`` (an array of
keys), all of which must hold:
- ``{"path": [...], "any": [v, ...]}``: the value equals one of them, or is an array that
  contains one;
- ``{"path": [...], "num": {"gte"|"gt"|"lte"|"lt": n, ...}}``: the value is a JSON number in
  the range;
- ``{"path": [...], "from": t, "until": t}`` (either may be absent): the value is a string
  PostgreSQL reads as a timestamptz, in [from, until).
A missing or null value fails every condition. A string that is not an ISO 8601 date or
date-time fails a time range without an error (a pattern, then ``kgstream_valid_time`` for
dates such as 2023-02-30: ``pg_input_is_valid`` on PostgreSQL 16+, an exception block on 15), so
one malformed document never fails a query; a time without an offset is UTC.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# ISO 8601 dates and date-times only (services/core/doc_scope.py ISO_TIME, the same pattern):
# PostgreSQL reads many other spellings ("Nov 24 2023"), which would make a filter's meaning
# depend on the database's parser.
ISO_TIME = (
    r"^\d{4}-\d{2}-\d{2}([T ]([01]\d|2[0-3]):[0-5]\d"
    r"(:[0-5]\d(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)?)?$"
)
MATCHES_FUNCTION = r"""
CREATE OR REPLACE FUNCTION kgstream_doc_matches(meta jsonb, conds jsonb) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $fn$
DECLARE
  c jsonb;
  x jsonb;
  s text;
  t timestamptz;
  n numeric;
BEGIN
  FOR c IN SELECT value FROM jsonb_array_elements(conds) LOOP
    x := meta #> ARRAY(SELECT jsonb_array_elements_text(c->'path'));
    IF x IS NULL OR jsonb_typeof(x) = 'null' THEN
      RETURN false;
    END IF;
    IF c ? 'any' AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements(c->'any') v
      WHERE x = v.value OR (jsonb_typeof(x) = 'array' AND x @> jsonb_build_array(v.value))
    ) THEN
      RETURN false;
    END IF;
    IF c ? 'num' THEN
      IF jsonb_typeof(x) <> 'number' THEN
        RETURN false;
      END IF;
      n := x::numeric;
      IF n < coalesce((c->'num'->>'gte')::numeric, n)
         OR n <= coalesce((c->'num'->>'gt')::numeric, n - 1)
         OR n > coalesce((c->'num'->>'lte')::numeric, n)
         OR n >= coalesce((c->'num'->>'lt')::numeric, n + 1) THEN
        RETURN false;
      END IF;
    END IF;
    IF c ? 'from' OR c ? 'until' THEN
      s := x #>> '{}';
      IF jsonb_typeof(x) <> 'string' OR s !~ '{ISO}' OR NOT kgstream_valid_time(s) THEN
        RETURN false;
      END IF;
      -- without an offset: UTC, whatever the session's time zone
      t := CASE WHEN s ~ '[T ][0-9:.]+(Z|[+-]\d{2}(:?\d{2})?)$' THEN s::timestamptz
           ELSE s::timestamp AT TIME ZONE 'UTC' END;
      IF t < coalesce((c->>'from')::timestamptz, t)
         OR t >= coalesce((c->>'until')::timestamptz, 'infinity'::timestamptz) THEN
        RETURN false;
      END IF;
    END IF;
  END LOOP;
  RETURN true;
END
$fn$
""".replace("{ISO}", ISO_TIME)


# Whether PostgreSQL reads the text as a timestamptz, without an error: pg_input_is_valid on
# PostgreSQL 16+, a subtransaction before (only strings that already look ISO get this far).
VALID_TIME = {
    True: "CREATE OR REPLACE FUNCTION kgstream_valid_time(s text) RETURNS boolean"
    " LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT pg_input_is_valid(s, 'timestamptz') $$",
    False: "CREATE OR REPLACE FUNCTION kgstream_valid_time(s text) RETURNS boolean"
    " LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$ BEGIN PERFORM s::timestamptz; RETURN true;"
    " EXCEPTION WHEN others THEN RETURN false; END $$",
}


def upgrade() -> None:
    version = int(op.get_bind().exec_driver_sql("SHOW server_version_num").scalar_one())
    op.execute(VALID_TIME[version >= 160000])
    op.execute(MATCHES_FUNCTION)
    with op.get_context().autocommit_block():
        op.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS documents_occurred_at"
            " ON documents (occurred_at) WHERE NOT deleted"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS documents_occurred_at")
    op.execute("DROP FUNCTION IF EXISTS kgstream_doc_matches(jsonb, jsonb)")
    op.execute("DROP FUNCTION IF EXISTS kgstream_valid_time(text)")
