"""`kgstream up` watches the embedded PostgreSQL and broker of its home while it runs.

A server is gone when its pid is (a frozen server keeps its pid, so a SIGSTOP or a long GC
pause is never mistaken for a death, and never answered with a restart that would lose what
the broker holds). A server this `up` started is started again with the restart backoff, on
the same port when it is still free; one that was already running when `up` started belongs
to whoever started it: `up` only reports it."""

from __future__ import annotations

import contextlib
import os
import sys

from services.cli.restarts import RestartPolicy
from services.core.infra.errors import InfraError
from services.core.infra.manager import Endpoints, infra_status, infra_up, resolve_endpoints
from services.core.infra.ports import pid_alive
from services.core.settings import Settings

LOSSES = {
    "postgres": "its data is on disk, so nothing committed is lost",
    "broker": "it keeps events in memory: those the indexer had not consumed yet are lost",
}
TITLES = {"postgres": "embedded PostgreSQL", "broker": "embedded broker"}


class InfraWatch:
    """The embedded servers of one home (configured URLs are not watched), by pid."""

    def __init__(self, settings: Settings, owned: bool) -> None:
        self.settings, self.owned = settings, owned
        self.policy = RestartPolicy()
        self.pids = self._recorded()
        self.down: set[str] = set()

    def _recorded(self) -> dict[str, int]:
        state = infra_status(self.settings)
        return {c.name: c.pid for c in (state.postgres, state.broker) if c.managed and c.pid}

    def check(self, now: float) -> Endpoints | None:
        """Notice servers that are gone, restart those this `up` owns once their backoff has
        passed; the endpoints after a restart (None when nothing was restarted)."""
        gone = {name for name, pid in self.pids.items() if not pid_alive(pid)}
        for name in sorted(gone - self.down):
            self._reap(self.pids[name])
            self.down.add(name)
            if not self.owned:
                say(
                    f"the {TITLES[name]} (pid {self.pids[name]}) is gone ({LOSSES[name]}); it "
                    "was running before this `kgstream up` started, so it is not restarted "
                    "here: `kgstream infra up` starts it again"
                )
                continue
            if self.policy.due_at is None:  # one restart brings back all that is gone
                self.policy.on_exit(now)
            delay = max(0.0, (self.policy.due_at or now) - now)
            say(
                f"the {TITLES[name]} (pid {self.pids[name]}) is gone ({LOSSES[name]}): "
                f"restarting it in {delay:g} s"
            )
        if not self.down:
            return None
        if not self.owned:
            self.pids = self._recorded()  # someone may have started it again
            self.down = {name for name in self.down if not pid_alive(self.pids.get(name, 0))}
            return None
        if self.policy.due_at is None or now < self.policy.due_at:
            return None
        try:
            infra_up(self.settings)
            endpoints = resolve_endpoints(self.settings)
        except InfraError as exc:
            delay = self.policy.on_exit(now)
            say(f"could not restart the embedded servers ({exc}): trying again in {delay:g} s")
            return None
        self.policy.on_start(now)
        self.pids, self.down = self._recorded(), set()
        pids = ", ".join(f"{TITLES[name]}: pid {pid}" for name, pid in self.pids.items())
        say(f"restarted the embedded servers ({pids})")
        return endpoints

    @staticmethod
    def _reap(pid: int) -> None:
        # The broker is a child of the `up` that started it: collect its exit status.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def say(line: str) -> None:
    """A line of `kgstream up`'s own output, on stderr."""
    print(f"kgstream up: {line}", file=sys.stderr, flush=True)
