"""Community engine (issue 4): change ratio, hierarchical Leiden, reports, snapshots.

How it fits together (one module per role):

- When: ``services/core/change_state.py`` reads the change state in one statement (distinct
  ``(kind, ref_id)`` in ``graph_changes`` past the published snapshot's watermark ÷ that
  snapshot's nodes + edges; 1.0 before the first snapshot if the graph is non-empty);
  ``policy.py`` decides (first build, request, threshold, max staleness; a minimum interval
  between runs, measured from the newest snapshot row so it holds across replicas).
  ``worker.py`` is the scheduled tick; ``app.py`` the composition root (apscheduler every
  ``communities_check_interval_s``).
- One at a time: ``lock.py`` holds ``pg_try_advisory_lock`` on a dedicated connection for the
  whole recompute; a second worker skips the tick (logged) and re-checks under the lock.
- Requests: ``kgstream recompute`` writes ``kg_meta['recompute_requested_at']`` (DB clock);
  it is pending until a snapshot created at or after it is published. The snapshot row is
  created before the graph is read, so such a snapshot always contains the requested state.
- Reading: ``loader.py`` takes SHARE on ``graph_changes`` for milliseconds, exports that MVCC
  snapshot to a REPEATABLE READ connection and releases the lock; the watermark (max id seen)
  is then exact although ids are allocated before commit. Rows stream by binary COPY into
  numpy arrays.
- Computing (pure, in a worker process): ``structure.py`` = ``graph.py`` (sorted undirected
  weighted edges) + ``leiden.py`` (level 0 modularity warm-started from the published level 0;
  communities above the level's size bound split on their induced subgraphs, all splits of a
  level in one igraph call) + PageRank + ``stable_ids.py`` (greedy Jaccard per level) +
  ``fingerprint.py``. A community whose fingerprint the published snapshot had keeps that
  community's children as they were; other splits are warm-started one level down.
- Reports: ``report_plan.py`` keeps a report when fingerprint and writer match; the rest are
  written deepest level first (``summaries.py``) so parents are written from their children's
  reports; ``reports.py`` (extractive) or ``llm_reports.py`` (OpenAI-compatible, structured
  output, token budget per level; unusable output falls back to extractive for that community,
  which is then retried at the next recompute). Summaries are embedded for ranking.
- Publishing: ``writer.py`` COPYs the rows of the 'building' snapshot; ``snapshots.py``
  retires the old and publishes the new one in one transaction, prunes to the last N and
  announces ``kgstream.snapshots`` after commit. ``recompute.py`` runs the whole sequence.
"""
