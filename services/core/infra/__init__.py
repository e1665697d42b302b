"""Embedded infrastructure: PostgreSQL and a Kafka-protocol broker for the offline default."""

from services.core.infra.errors import InfraError

__all__ = ["InfraError"]
