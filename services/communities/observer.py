"""What the communities worker reports while it works (docs/metrics.md, "Communities worker"),
as a framework-free interface carried by RecomputeDeps; the composition root passes the
Prometheus one (services/communities/metrics.py), tests and the CLI get ``NO_OBSERVER``."""

from __future__ import annotations

from typing import Literal

from services.core.model_meter import ModelMeter

Decision = Literal["recompute", "wait", "locked"]
Phase = Literal["load", "leiden", "reports", "write"]
Result = Literal["published", "failed"]


class CommunitiesObserver(ModelMeter):
    """Receives the worker's figures; every method returns at once and never raises."""

    def check(self, decision: Decision) -> None:
        """A scheduler check decided."""

    def change(self, ratio: float, threshold: float) -> None:
        """The change ratio since the published snapshot, and the threshold it is held to."""

    def withheld(self, communities: int) -> None:
        """Published communities withheld from every caller for a delete since the snapshot."""

    def lock_wait(self, seconds: float) -> None:
        """Time spent asking for the recompute lock."""

    def phase(self, phase: Phase, seconds: float) -> None:
        """A recompute spent ``seconds`` in ``phase``."""

    def recompute(self, result: Result) -> None:
        """A recompute ended."""

    def reports(self, reused: int, generated: int) -> None:
        """A published recompute reused and generated community reports."""


NO_OBSERVER = CommunitiesObserver()

# RecomputeResult.timings keys -> the catalogue's phases (publish and prune are not timed).
PHASE_TIMINGS: dict[str, Phase] = {
    "load_s": "load",
    "compute_s": "leiden",
    "reports_s": "reports",
    "write_s": "write",
}
