from __future__ import annotations

from pathlib import Path

import pytest

from services.core.cpu_budget import (
    THREAD_ENV,
    available_cpus,
    cgroup_quota,
    cpu_threads,
    parse_cfs,
    parse_cpu_max,
    parse_cpu_threads,
    size_thread_pools,
)
from services.core.errors import ConfigurationError
from services.core.settings import Settings


@pytest.mark.parametrize(
    ("content", "cpus"),
    [("max 100000\n", None), ("150000 100000\n", 1.5), ("200000 100000", 2.0), ("", None)],
)
def test_cpu_max(content: str, cpus: float | None) -> None:
    assert parse_cpu_max(content) == cpus


def test_cfs_v1_unlimited_and_limited() -> None:
    assert parse_cfs("-1\n", "100000\n") is None
    assert parse_cfs("50000\n", "100000\n") == 0.5


def test_cgroup_v2_file_wins_and_missing_means_none(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path) is None
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path) == 3.0
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert cgroup_quota(tmp_path) == 1.0
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroup_quota(tmp_path) is None


def test_affinity_capped_by_quota_rounded_up() -> None:
    assert available_cpus({0, 1, 2, 3}, None) == 4
    assert available_cpus({0, 1, 2, 3}, 1.5) == 2
    assert available_cpus({0}, 8.0) == 1
    assert available_cpus(set(), 0.2) == 1


def test_auto_and_explicit_counts() -> None:
    def eight_cpus() -> set[int]:
        return set(range(8))

    def quota() -> float:
        return 2.5

    assert cpu_threads("auto", affinity=eight_cpus, quota=quota) == 3
    assert cpu_threads(" AUTO ", affinity=eight_cpus, quota=lambda: None) == 8
    assert cpu_threads("1", affinity=eight_cpus, quota=quota) == 1
    assert cpu_threads("12", affinity=eight_cpus, quota=quota) == 12


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5", ""])
def test_invalid_values_are_a_configuration_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="KGSTREAM_CPU_THREADS"):
        parse_cpu_threads(bad)


def test_setting_defaults_to_auto_and_rejects_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().cpu_threads == "auto"
    monkeypatch.setenv("KGSTREAM_CPU_THREADS", "03")
    assert Settings().cpu_threads == "3"
    monkeypatch.setenv("KGSTREAM_CPU_THREADS", "lots")
    with pytest.raises(ConfigurationError, match="positive integer"):
        Settings()


def test_thread_pools_sized_unless_the_operator_chose() -> None:
    env = {"OMP_NUM_THREADS": "4"}
    size_thread_pools(2, env)
    assert env["OMP_NUM_THREADS"] == "4"
    assert all(env[name] == "2" for name in THREAD_ENV if name != "OMP_NUM_THREADS")
