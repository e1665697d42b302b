"""The retrieval engine: every read a question, an entity, a path, a fact or a document makes,
and the answers made from them, for any caller (issue 32 moved it out of services/query_api,
which keeps the HTTP and MCP edge: routes, auth, admission, limits, readiness, dashboard).
It imports no web framework and no metrics library: it reports through observers
(``read_observer``, ``services.core.model_meter``), raises domain errors
(``replicas.NotCaughtUp``, ``as_of.HistoryNotKept``, pydantic's validation errors), and the
edge maps them to HTTP problems and MCP tool errors (services/query_api/problems.py).

- ``service``: QueryService, one question end to end (mode, retrieval, answer); ``compose``:
  a process's service from its settings; ``schemas``: requests and responses.
- Modes: ``vector`` (+ ``lexical``: BM25), ``local`` (``grounding``, ``neighbourhood``,
  ``ranking``, ``reseed``, ``chains``, ``chain_search``, ``multistep`` / ``followup``: LLM
  follow-ups), ``global_mode`` (+ ``community_vectors``, ``map_reduce``), ``paths``, ``router``
  (auto), ``as_of`` (passages of a past state).
- Answers: ``answer`` (offline and LLM), ``answer_kind``, ``answer_span``, ``time_scope``,
  ``llm``; ``contexts``: a retrieval's passages and mentions; ``monitoring``: query ids, A/B
  arms, path patterns.
- Reads beside questions: ``entities``, ``documents``, ``fact_times``.
- Who sees what: ``visibility`` (document ACLs in SQL), ``filters`` (a query's document
  scope), ``facets`` (the sources a question names).
- Where reads go: ``snapshot`` (one REPEATABLE READ transaction per request), ``replicas`` and
  ``replica_monitor`` (read replicas and their lag), ``read_observer``.
"""
