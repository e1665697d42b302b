"""The README's first command, as a user runs it: `kgstream demo` on the embedded default."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import user_env

pytestmark = pytest.mark.e2e


def test_demo_indexes_and_answers(tmp_path: Path, user_home: Path) -> None:
    env = user_env(user_home)
    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "published 48 document events" in out
    assert "indexed: 48 documents" in out
    assert "graph explorer: http://127.0.0.1:" in out
    assert out.count("\nQ: ") == 5
    assert out.count("\nA: ") == 6  # five sample questions (local) and one global
    # Every answer cites a document and at least one gold document is marked among the sources.
    assert "   * " in out
    held = out.split("\nWhat held in 1986? ", 1)[1]
    assert "Maximum Overdrive is a 1986 American" in held.split("\nwaiting for", 1)[0], held[:2000]
    # The communities worker published a snapshot of the indexed graph, shown by level.
    snapshot = re.search(r"community snapshot (\d+) published: (\d+) communities \(level 0: ", out)
    assert snapshot, out[-3000:]
    assert int(snapshot.group(2)) > 0
    assert "change ratio since it: 0.000, at or below the recompute threshold 0.10" in out
    # One global question answered from that snapshot, with the communities and passages used.
    after = out.split("\nQ (global): ", 1)[1]
    assert f"(mode global, snapshot {snapshot.group(1)})" in after
    assert re.search(r"\n   community \d+ \(level \d+, \d+ entities\): ", after)
    assert re.search(r"\n     .+ \[hotpotqa-[0-9a-f]+\] score ", after)
    assert "demo finished; everything is stopped" in out
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # Everything the demo started is stopped again.
    status = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "infra", "status", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert '"alive": true' not in status.stdout
