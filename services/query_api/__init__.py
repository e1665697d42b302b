"""The query process's HTTP and MCP edge over the retrieval engine (services/retrieval): the
FastAPI app and its composition root (``app``), routes (``routes``, ``curation_routes``), the
MCP server (``mcp_server``), what both offer a caller (``operations``), API keys (``auth``),
admission and limits (``limits``), problems (``problems``: domain errors as HTTP statuses and
MCP tool errors), HTTP ingest (``ingest``), readiness and probes (``readiness``,
``probe_server``, ``heartbeat``), metrics (``metrics``) and the dashboard (``dashboard``,
``sampler``)."""
