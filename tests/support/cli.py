"""Run the `kgstream` CLI pointed at one test's database and topics: in this process through
Typer's runner (the default: no interpreter start and imports per call), or in a subprocess as a
user runs it (``process=True``; the e2e tests and the process tests run it so; every call does
with KGSTREAM_TESTS_CLI_SUBPROCESS=1 in the environment, to compare)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def user_env(home: Path, **settings: str) -> dict[str, str]:
    """A user's environment on the embedded default: no KGSTREAM_* but ``home``, log level
    WARNING and the given settings (``log_format="json"`` is KGSTREAM_LOG_FORMAT=json); this
    checkout's code first on the path, whatever the virtualenv has installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGSTREAM_")}
    env["PYTHONPATH"] = str(ROOT)
    env["KGSTREAM_HOME"] = str(home)
    env["KGSTREAM_LOG_LEVEL"] = "WARNING"
    env.update({f"KGSTREAM_{name.upper()}": value for name, value in settings.items()})
    return env


def env_for(settings: Settings) -> dict[str, str]:
    """The process environment that makes the CLI use these settings."""
    return {
        **os.environ,
        "KGSTREAM_HOME": str(settings.home),
        "KGSTREAM_DATABASE_URL": str(settings.database_url),
        "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS": str(settings.kafka_bootstrap_servers),
        "KGSTREAM_DOCUMENTS_TOPIC": settings.documents_topic,
        "KGSTREAM_DLQ_TOPIC": settings.dlq_topic,
        "KGSTREAM_SNAPSHOTS_TOPIC": settings.snapshots_topic,
        "KGSTREAM_CONSUMER_GROUP": settings.consumer_group,
        "KGSTREAM_MAX_DOCUMENT_BYTES": str(settings.max_document_bytes),
        "KGSTREAM_CLOUDEVENTS_TYPES": settings.cloudevents_types,
        "KGSTREAM_INDEXER_STALL_AFTER_S": str(settings.indexer_stall_after_s),
        "KGSTREAM_LOG_LEVEL": "WARNING",
        # Tests run several workers on one host: each takes any free metrics port.
        "KGSTREAM_INDEXER_METRICS_PORT": "0",
        "KGSTREAM_COMMUNITIES_METRICS_PORT": "0",
    }


def kgstream(
    settings: Settings, *args: str, timeout: float = 300, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """`kgstream ARGS...` to completion, output captured: in this process unless ``process``."""
    if not process and not os.environ.get("KGSTREAM_TESTS_CLI_SUBPROCESS"):
        return in_process(env_for(settings), *args, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env=env_for(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def in_process(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`kgstream ARGS...` through Typer's runner with ``env`` as its environment, as `main()`
    runs it (a KgstreamError is `error: ...` and code 1). On a thread of its own: the CLI runs
    its own event loops, and a test's loop may be running on this one. What it changes in the
    process's logging (services/core/logs.py) is undone afterwards."""
    from typer.testing import CliRunner

    from services.cli.main import app
    from services.core.errors import KgstreamError

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    excepthook = threading.excepthook
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kgstream-cli") as pool:
            result = pool.submit(CliRunner().invoke, app, list(args), env=env).result(timeout)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.captureWarnings(False)
        threading.excepthook = excepthook
    stdout, stderr, code = result.stdout, result.stderr, result.exit_code
    if isinstance(result.exception, KgstreamError):
        stderr += f"error: {result.exception}\n"
    elif result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["kgstream", *args], code, stdout, stderr)


@dataclass
class Up:
    """A running `kgstream up` and the files its stdout and stderr go to."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def log(self) -> str:
        """Its stdout and the end of its stderr, for assertion messages."""
        return self.out.read_text() + self.err.read_text()[-4000:]


@contextlib.contextmanager
def kgstream_up(env: dict[str, str], cwd: Path, timeout: float = 300) -> Iterator[Up]:
    """`kgstream up` in its own process group (like a terminal's foreground job), once it says
    "Ctrl-C to stop"; at the end, if `up` still runs, the group gets Ctrl-C (SIGINT), and is
    SIGKILLed only if that does not stop it within 120 s."""
    out, err = cwd / "up.out", cwd / "up.err"
    with out.open("wb") as out_file, err.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "up"],
            env=env,
            cwd=cwd,
            stdout=out_file,
            stderr=err_file,
            start_new_session=True,
        )
    up = Up(proc, out, err)
    try:
        deadline = time.monotonic() + timeout
        while "Ctrl-C to stop" not in out.read_text():
            assert proc.poll() is None, up.log()
            assert time.monotonic() < deadline, up.log()
            time.sleep(0.5)
        yield up
    finally:
        if proc.poll() is None:
            # Ctrl-C first, as a user stops it: `up` stops the embedded servers it started (the
            # broker runs in a session of its own, which killing the group would leave running).
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
