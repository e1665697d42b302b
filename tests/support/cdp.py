"""Headless Chromium driven over the DevTools protocol (a real browser for the page tests:
tests/integration/test_explorer_chromium.py): start it, open a page, evaluate JavaScript in
it (the page's own handlers run), wait for a condition and take screenshots. Synchronous;
call it from a thread in async tests."""

from __future__ import annotations

import base64
import itertools
import json
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

_LISTENING = re.compile(r"DevTools listening on (ws://[^\s]+)")
# Flags that keep a headless browser off the network but for the pages it is sent to.
OFFLINE = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FLAGS = (*OFFLINE, "--remote-debugging-port=0", "--remote-allow-origins=*")


class PageError(AssertionError):
    """JavaScript threw, or a condition never held: what the page said."""


class Page:
    """One tab: the DevTools session of a page target."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One protocol command's result (events in between are dropped)."""
        sent = next(self._ids)
        self._ws.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=60))
            if reply.get("id") == sent:
                if "error" in reply:
                    raise PageError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (a promise is awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise PageError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        """Open ``url`` and wait until ``ready`` holds."""
        self.send("Page.navigate", url=url)
        time.sleep(0.05)  # pacing: the old document may still answer readyState
        self.wait_for(ready)

    def wait_for(self, condition: str, timeout_s: float = 60.0) -> Any:
        """Poll until the JavaScript ``condition`` is truthy; its value."""
        deadline = time.monotonic() + timeout_s  # a bound for a broken run, not a measure
        while True:
            value = self.evaluate(condition)
            if value:
                return value
            if time.monotonic() > deadline:
                status = self.evaluate("document.getElementById('status')?.textContent ?? ''")
                raise PageError(f"never held: {condition} (status: {status!r})")
            time.sleep(0.1)  # pacing between polls

    def screenshot(self, path: Path, width: int = 1400, height: int = 900) -> Path:
        """A PNG of the page at this size."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextmanager
def browser(binary: str, profile: Path) -> Iterator[Page]:
    """Headless Chromium with one page, closed afterwards."""
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,900", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        found = None
        for line in proc.stderr:  # it says where it listens before anything else matters
            found = _LISTENING.search(line)
            if found:
                break
        if found is None:
            raise PageError(f"chromium exited ({proc.wait()}) without a DevTools address")
        port = found.group(1).split(":")[2].split("/")[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
