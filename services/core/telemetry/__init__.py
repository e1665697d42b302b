"""Prometheus telemetry shared by every process (docs/metrics.md, "Every process"): build info,
the database pool, model calls, and the small HTTP server and process registration the worker
processes use. Only composition roots import this package; handlers report through
framework-free observers (services/core/model_meter.py and each process's observer)."""
