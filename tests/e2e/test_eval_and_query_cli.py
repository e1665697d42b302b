"""`kgstream eval` and `kgstream query` as a user runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.infra.postgres import EmbeddedPostgres
from services.core.settings import Settings
from services.query_api.app import create_app
from tests.conftest import Infra
from tests.support.cli import env_for, user_env
from tests.support.server import serving

pytestmark = pytest.mark.e2e
SAMPLE = Path(__file__).resolve().parents[2] / "services" / "cli" / "sample"
METRICS = {"recall", "all_gold", "mrr", "p50_ms", "p99_ms", "n", "recall_at_2", "recall_at_5"}
METRICS |= {"answer_em", "answer_f1", "answer_contains", "last_gold_rank"}
METRICS |= {"llm_calls", "llm_tokens", "followup_tokens"}
METRICS |= {"n_gold", "n_answerable", "majority_answer", "majority_share", "yes_no_accuracy"}
METRICS |= {"n_yes_no", "unanswerable", "abstained", "abstain_recall", "abstain_precision"}
METRICS |= {"abstain_wrong"}


def run_eval(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`kgstream eval` on the sample as a user runs it."""
    args = ["eval", "--events", str(SAMPLE / "events.jsonl")]
    args += ["--questions", str(SAMPLE / "questions.jsonl"), *extra]
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env=user_env(tmp_path / "home"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_eval_on_the_sample(tmp_path: Path) -> None:
    done = run_eval(tmp_path, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["k"] == 10
    assert list(report["modes"]) == ["vector", "local", "global", "auto"]
    for mode, rep in report["modes"].items():
        assert set(rep) == {"overall", "by_type", "by_gold", "by_hops", "hop_ranks"}, mode
        assert set(rep["by_type"]) == {"bridge", "comparison"}
        assert set(rep["by_gold"]) == {"2"}
        assert rep["by_hops"] == rep["by_gold"]  # HotpotQA: 2 hops, 2 gold documents
        assert rep["hop_ranks"] == {}  # no hop decomposition, so no hop order
        for summary in [rep["overall"], *rep["by_type"].values(), *rep["by_gold"].values()]:
            assert set(summary) == METRICS
            assert 0 <= summary["recall_at_2"] <= summary["recall_at_5"] <= summary["recall"] <= 1
            assert 0 <= summary["all_gold"] <= summary["recall"] <= 1
            assert 0 <= summary["answer_em"] <= summary["answer_f1"] <= 1
            assert 0 <= summary["answer_contains"] <= 1
            assert 2 <= summary["last_gold_rank"] <= 11  # two gold documents, k = 10
            assert summary["llm_calls"] == summary["llm_tokens"] == summary["followup_tokens"] == 0
            assert 0 < summary["p50_ms"] <= summary["p99_ms"]
        assert rep["overall"]["n"] == rep["by_gold"]["2"]["n"] == 12
        assert rep["by_type"]["bridge"]["n"] == 9
    for mode in ("vector", "local", "auto"):
        assert report["modes"][mode]["overall"]["all_gold"] >= 0.9, mode
    # the embedded server of the temporary home is gone
    assert not list((tmp_path / "home").glob("**/postmaster.pid"))


@pytest.fixture
def keep(tmp_path: Path) -> Iterator[Path]:
    """A --keep home, purged afterwards like ``user_home`` (tests/e2e/conftest.py)."""
    home = tmp_path / "kept"
    yield home
    EmbeddedPostgres(home).purge()


def test_eval_keep_reuses_the_ingest(tmp_path: Path, keep: Path) -> None:
    first = run_eval(tmp_path, "--keep", str(keep), "--modes", "vector,local", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    assert not list(keep.glob("**/postmaster.pid"))  # stopped, not left running
    again = run_eval(tmp_path, "--keep", str(keep), "--modes", "vector,local")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ingest reused" in again.stdout
    assert "ingest:" not in again.stdout  # nothing was ingested the second time
    table = again.stdout
    assert "local    2 hops" in table
    assert "2 gold" not in table  # the same group as "2 hops": printed once
    for mode, rep in json.loads(first.stdout)["modes"].items():  # same database, same ranking
        row = next(line for line in table.splitlines() if line.startswith(f"{mode:<8} overall"))
        assert f"{rep['overall']['all_gold']:.3f}" in row
        assert f"{rep['overall']['mrr']:.3f}" in row
    # a marker whose database was deleted (a reboot clears /var/tmp) is rebuilt, not trusted
    shutil.rmtree(EmbeddedPostgres(keep).data_dir)
    rebuilt = run_eval(tmp_path, "--keep", str(keep), "--modes", "vector")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert "its database is gone" in rebuilt.stdout
    assert "ingest reused" not in rebuilt.stdout
    row = next(line for line in rebuilt.stdout.splitlines() if line.startswith("vector   overall"))
    assert f"{json.loads(first.stdout)['modes']['vector']['overall']['all_gold']:.3f}" in row
    # a directory that is not a kept eval database is refused, untouched
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = run_eval(tmp_path, "--keep", str(foreign))
    assert refused.returncode == 2
    assert "holds no kept eval database" in refused.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


@pytest.fixture
def running_api(community_db: str, infra: Infra) -> Iterator[Settings]:
    """The query API on a free port, serving the indexed sample (its own process thread)."""
    port = free_port()
    settings = Settings(
        home=infra.home,
        database_url=community_db,
        kafka_bootstrap_servers=infra.bootstrap,
        api_port=port,
    )
    with serving(create_app(settings, Endpoints(community_db, infra.bootstrap)), port):
        yield settings


def local_queries(port: int) -> float:
    """The API's count of answered local queries (the metrics registry is per process)."""
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    prefix = 'kgstream_query_seconds_count{mode="local"} '
    lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def test_query_via_api_and_direct_print_the_same_json(running_api: Settings) -> None:
    question = "Who directed the film that was shot in Leland, North Carolina?"
    args = [sys.executable, "-m", "services.cli.main", "query", question, "--mode", "local"]
    args += ["--json"]
    env = {**env_for(running_api), "KGSTREAM_API_PORT": str(running_api.api_port)}
    env["KGSTREAM_QUERY_API_PROBE_S"] = "2"
    before = local_queries(running_api.api_port)
    via_api = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert via_api.returncode == 0, via_api.stderr[-2000:]
    assert local_queries(running_api.api_port) == before + 1  # it went through the API
    env["KGSTREAM_API_PORT"] = str(free_port())  # nothing listens there: direct
    direct = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert direct.returncode == 0, direct.stderr[-2000:]
    a, b = json.loads(via_api.stdout), json.loads(direct.stdout)
    assert set(a) == set(b)
    assert a["mode_used"] == b["mode_used"] == "local"
    assert [c["chunk_id"] for c in a["contexts"]] == [c["chunk_id"] for c in b["contexts"]]
    assert {"doc_id", "chunk_id", "score", "text"} <= set(a["contexts"][0])
