"""Where this process's consumer is, per partition, as last recorded in indexer_progress: the
progress writer (progress.py) tells from it when the consumer went back (services/indexer/
progress.py, "a new epoch")."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Positions:
    """The next offset this process last recorded per (topic, partition)."""

    recorded: dict[tuple[str, int], int] = field(default_factory=dict)

    def went_back(self, partition: tuple[str, int], next_offset: int) -> bool:
        """True for the first batch on ``partition`` or one ending below the last recorded."""
        last = self.recorded.get(partition)
        return last is None or next_offset < last
