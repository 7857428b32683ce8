"""Child processes that never outlive their parent (used by `nitsum serve`).

Three layers, because each covers a way the parent can go that the others miss:
- one process group for all children, so a last `killpg(SIGKILL)` also reaches grandchildren;
- `atexit` (normal exit, uncaught exception) stops them: signal, wait, then kill;
- Linux `PR_SET_PDEATHSIG`: the kernel sends SIGTERM to a child whose parent died, even by
  SIGKILL, when no Python code runs any more.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Children:
    """Named child processes in one process group; `stop` is idempotent and bounded."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.pgid: int | None = None
        self._group_killed = False
        atexit.register(self.stop)

    def spawn(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start `cmd`; the first child leads the group and every later one joins it."""
        # NOTE: the group must still exist to join it: spawn while the first child lives.
        proc = subprocess.Popen(
            cmd,
            env=env,
            process_group=self.pgid or 0,
            # NOTE: preexec_fn is unsafe with threads; `nitsum serve` starts none.
            preexec_fn=_die_with_parent,
        )
        if self.pgid is None:
            self.pgid = proc.pid
        # A restarted child replaces its earlier, exited self in place.
        # NOTE: in place keeps the first-started child (the router) first: stop() stops it last.
        at = next(
            (i for i, (n, p) in enumerate(self.procs) if n == name and p.poll() is not None),
            len(self.procs),
        )
        self.procs[at : at + 1] = [(name, proc)]
        log.info("started %s (pid %d): %s", name, proc.pid, " ".join(cmd))
        return proc

    def exited(self) -> list[tuple[str, int]]:
        """(name, exit code) of every child that has exited."""
        return [(n, p.returncode) for n, p in self.procs if p.poll() is not None]

    def send_signal(self, signum: int) -> None:
        """Forward `signum` to every live child."""
        for _, p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the later children together, then the first (workers before the router, so
        their last messages still reach it); kill whoever outlasts the grace period."""
        for wave in (self.procs[1:], self.procs[:1]):
            deadline = time.monotonic() + self.grace_s
            for _, p in wave:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signum)
            for name, p in wave:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s (pid %d) ignored signal %d: killing it", name, p.pid, signum)
                    p.kill()
                    p.wait()
        if self.pgid is not None and not self._group_killed:
            # Grandchildren (e.g. a router's helpers) share the group. Once only: an empty
            # group's id may be reused by an unrelated process later.
            self._group_killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
