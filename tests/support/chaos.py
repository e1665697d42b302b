"""Plumbing for the chaos test: the worker processes `kgstream up` supervises, and two
background recorders (a query flood and a readiness prober) whose samples are later checked
against the outage windows the test opened."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def children(parent: int) -> dict[str, int]:
    """``kgstream worker NAME`` processes whose parent is ``parent``: name -> pid."""
    found: dict[str, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) != parent or fields[0] == "Z":
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "worker" in words and words.index("worker") + 1 < len(words):
            found[words[words.index("worker") + 1]] = int(stat.parent.name)
    return found


@dataclass(frozen=True)
class Sample:
    """One request: when it started and ended (monotonic), its route and its status (0 when
    nothing answered: connection refused or the client's timeout)."""

    route: str
    start: float
    end: float
    status: int


@dataclass
class Windows:
    """Named outage windows on the monotonic clock; one still open has no end."""

    spans: list[tuple[str, float, float | None]] = field(default_factory=list)

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        index = len(self.spans)
        self.spans.append((name, start, None))
        try:
            yield
        finally:
            self.spans[index] = (name, start, time.monotonic())

    def begin(self, name: str) -> int:
        self.spans.append((name, time.monotonic(), None))
        return len(self.spans) - 1

    def end(self, index: int) -> None:
        name, start, _ = self.spans[index]
        self.spans[index] = (name, start, time.monotonic())

    def covering(self, sample: Sample, grace: float) -> str | None:
        """The window a request overlapped (its end extended by ``grace``), if any."""
        for name, start, end in self.spans:
            stop = (end if end is not None else float("inf")) + grace
            if sample.start <= stop and sample.end >= start:
                return name
        return None


class Recorder:
    """Background threads sending requests to the query API until stopped, keeping a sample per
    request: ``flood`` clients spreading queries over the read routes, and one readiness prober."""

    QUESTIONS = (
        "Who discovered radium?",
        "Where did Marie Curie work?",
        "What is the capital of France?",
    )

    def __init__(self, api: str, flood: int, probe_interval: float = 0.25) -> None:
        self.api, self.flood, self.probe_interval = api, flood, probe_interval
        self.requests: list[Sample] = []
        self.probes: list[Sample] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=flood + 1)

    def __enter__(self) -> Recorder:
        self._pool.submit(self._probe)
        for n in range(self.flood):
            self._pool.submit(self._client, n)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)

    def _send(
        self, client: httpx.Client, route: str, method: str, url: str, **kw: object
    ) -> Sample:
        start = time.monotonic()
        try:
            status = client.request(method, url, **kw).status_code  # type: ignore[arg-type]
        except httpx.HTTPError:
            status = 0
        return Sample(route, start, time.monotonic(), status)

    def _client(self, n: int) -> None:
        with httpx.Client(base_url=self.api, timeout=10) as client:
            i = n
            while not self._stop.is_set():
                question = self.QUESTIONS[i % len(self.QUESTIONS)]
                kind = i % 3
                if kind == 0:
                    body = {"question": question, "mode": "vector", "k": 5}
                    sample = self._send(client, "query", "POST", "/v1/query", json=body)
                elif kind == 1:
                    sample = self._send(client, "entities", "GET", "/v1/entities?name=Curie")
                else:
                    sample = self._send(client, "communities", "GET", "/v1/communities")
                self.requests.append(sample)
                if sample.status == 0:
                    time.sleep(0.2)  # nothing listens: do not spin
                i += 1

    def _probe(self) -> None:
        with httpx.Client(base_url=self.api, timeout=5) as client:
            while not self._stop.is_set():
                self.probes.append(self._send(client, "readyz", "GET", "/readyz"))
                self._stop.wait(self.probe_interval)
