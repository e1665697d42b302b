"""How many CPU threads one process may use (KGSTREAM_CPU_THREADS), and sizing the native
thread pools to it: onnxruntime's intra-op threads (services/core/embedding.py) and the
OpenMP/BLAS pools numpy and spaCy's thinc read from the environment when they load.

"auto" is the CPUs the process may run on (its affinity mask, what `taskset` and Kubernetes'
static CPU manager set), capped by the cgroup CPU quota (`cpu.max` on cgroup v2,
`cpu.cfs_quota_us`/`cpu.cfs_period_us` on v1: what `docker --cpus` and a Kubernetes CPU
limit set). Without this, onnxruntime starts one thread per core of the machine in every
indexer process, and N indexers on one host oversubscribe it."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, MutableMapping
from pathlib import Path

from services.core.errors import ConfigurationError

AUTO = "auto"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Read by OpenMP, OpenBLAS, MKL, BLIS (thinc) and numexpr when they load.
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def parse_cpu_threads(value: str) -> str:
    """``value`` as the setting keeps it ("auto" or a positive integer as text); a
    ConfigurationError that names the setting otherwise."""
    spec = value.strip().lower()
    if spec == AUTO:
        return AUTO
    if spec.isdigit() and int(spec) >= 1:
        return str(int(spec))
    raise ConfigurationError(
        f"KGSTREAM_CPU_THREADS must be 'auto' or a positive integer (threads), not {value!r}"
    )


def parse_cpu_max(content: str) -> float | None:
    """cgroup v2 ``cpu.max`` ("QUOTA PERIOD", QUOTA may be "max") as CPUs; None = no quota."""
    parts = content.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100_000
    quota = int(parts[0])
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota: str, period: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` as CPUs; None = no quota (-1)."""
    q, p = int(quota.strip()), int(period.strip())
    return q / p if q > 0 and p > 0 else None


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of the cgroup this process sees at ``root`` (v2, else v1); None = none or
    unreadable."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            return parse_cpu_max(v2.read_text())
        v1 = root / "cpu"
        if (v1 / "cpu.cfs_quota_us").is_file():
            return parse_cfs(
                (v1 / "cpu.cfs_quota_us").read_text(), (v1 / "cpu.cfs_period_us").read_text()
            )
    except (OSError, ValueError):
        return None
    return None


def available_cpus(affinity: Collection[int], quota: float | None) -> int:
    """CPUs in the affinity mask, capped by the quota rounded up; at least one."""
    cpus = max(1, len(affinity))
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def _affinity() -> Collection[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not on Linux
        return range(os.cpu_count() or 1)


def cpu_threads(
    setting: str,
    *,
    affinity: Callable[[], Collection[int]] = _affinity,
    quota: Callable[[], float | None] = cgroup_quota,
) -> int:
    """Threads for the setting: the number given, or the CPUs this process may use."""
    spec = parse_cpu_threads(setting)
    if spec != AUTO:
        return int(spec)
    return available_cpus(affinity(), quota())


def size_thread_pools(threads: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Set the OpenMP/BLAS thread variables to ``threads`` unless the operator set them: call
    before numpy, onnxruntime or spaCy load (they read them once)."""
    env = os.environ if environ is None else environ
    for name in THREAD_ENV:
        env.setdefault(name, str(threads))
