"""The README's first command, as a user runs it: `kgstream demo` on the embedded default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_demo_indexes_and_answers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGSTREAM_")}
    env["KGSTREAM_HOME"] = str(tmp_path / "home")
    env["KGSTREAM_LOG_LEVEL"] = "WARNING"
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
    assert out.count("\nQ: ") == 5
    assert out.count("\nA: ") == 5
    # Every answer cites a document and at least one gold document is marked among the sources.
    assert "   * " in out
    assert "demo finished; everything is stopped" in out
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
