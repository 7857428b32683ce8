"""Heartbeats from their own thread while the serving loop is inside an engine step.

The serving loop (`server.py`) sends `register` / `heartbeat` itself between steps. One step
can last long (a prefill of thousands of tokens on a busy host, a TP switch), and a worker
that says nothing for `heartbeat_timeout_ms` is suspect to the router (docs/serving.md
"Stalls and deaths"): so while a step runs, this thread sends each device's latest heartbeat
on its timer. A long step is then slow, not silent; only a stopped or dead process is.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from nitsum.worker.link import LinkKey, RouterLink
from nitsum.worker.protocol import Heartbeat

log = logging.getLogger(__name__)


class StepHeartbeats:
    """Sends heartbeats on `links` while the serving loop is in `stepping()`.

    NOTE (thread safety): ZMQ sockets are not thread-safe, so exactly one thread may use the
    links at any moment. `sockets` is that right: the serving loop holds it from `start()` to
    `close()` except inside `stepping()`, around `backend.step()`, which touches no socket;
    this thread uses a link (its timers and its socket) only while it holds `sockets`. The
    lock's hand-over is the full memory barrier ZMQ asks for when a socket changes threads.
    """

    def __init__(self, links: dict[LinkKey, RouterLink], every_s: float) -> None:
        self.sockets = threading.Lock()
        self.links = links
        self.every_s = every_s
        # Each device's latest heartbeat, built by the serving loop (its load as of then); it
        # goes to every router the device serves.
        # NOTE: the thread resends it as it is: it proves liveness; the load it reports is at
        # most one step old, and computing a fresh one would read engine state mid-step.
        self.latest: dict[int, Heartbeat] = {}
        self.sent = 0  # heartbeats this thread sent (they mean a step outlasted the timer)
        # Links whose last heartbeat was one of this thread's (a load up to a step old).
        # NOTE: the serving loop sends a fresh one after the step even if the timer is not
        # due: otherwise, with steps longer than the timer, the thread's resends reset the
        # timer every time and the router would see the load of the first step forever.
        self.stale: set[LinkKey] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nitsum-heartbeat", daemon=True)

    def start(self) -> None:
        """Take the sockets for the serving loop, then start the thread."""
        self.sockets.acquire()
        self._thread.start()

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """Lend the sockets to the heartbeat thread for the duration of one engine step."""
        self.sockets.release()
        try:
            yield
        finally:
            self.sockets.acquire()

    def close(self) -> None:
        """Stop the thread (called by the serving loop, which holds the sockets)."""
        self._stop.set()
        self.sockets.release()
        try:
            self._thread.join(timeout=5.0)
        finally:
            self.sockets.acquire()

    def _run(self) -> None:
        tick = max(self.every_s / 4, 0.01)
        while not self._stop.wait(tick):
            with self.sockets:
                if self._stop.is_set():
                    return
                now = time.monotonic()
                for key, link in self.links.items():
                    beat = self.latest.get(key[1])
                    # NOTE: nothing but the handshake goes to a router that has not accepted us.
                    if beat is not None and link.registered and link.heartbeat_due(now):
                        link.send(beat)
                        self.sent += 1
                        self.stale.add(key)
