"""Restarting workers that die (`nitsum serve`): exponential backoff, reset by a long life.

A worker that exits is started again after `base_s`, then twice as long after each quick
death (one that lived less than `healthy_s`), capped at `max_s`: a crash loop (e.g. a bad
model file) costs one attempt per `max_s`, not a busy loop, while a worker killed once after
an hour of service is back within `base_s`. The router re-dispatches what the dead worker held
(docs/protocol.md) and registers the new one like any other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class _Track:
    started: float
    failures: int = 0  # consecutive quick deaths
    due: float | None = None  # when to start it again


@dataclass
class Restarts:
    """When each named worker should be started again."""

    base_s: float = 1.0
    max_s: float = 30.0
    healthy_s: float = 60.0
    tracks: dict[str, _Track] = field(default_factory=dict)

    def started(self, name: str, now: float | None = None) -> None:
        """`name` was (re)started."""
        now = time.monotonic() if now is None else now
        track = self.tracks.setdefault(name, _Track(started=now))
        track.started, track.due = now, None

    def exited(self, name: str, code: int | None, now: float | None = None) -> float:
        """`name` exited; returns the delay before its restart (scheduled once per exit)."""
        now = time.monotonic() if now is None else now
        track = self.tracks.setdefault(name, _Track(started=now))
        if track.due is not None:
            return track.due - now
        lived = now - track.started
        track.failures = 0 if lived >= self.healthy_s else track.failures + 1
        delay = min(self.max_s, self.base_s * 2 ** max(0, track.failures - 1))
        track.due = now + delay
        log.error(
            "%s exited with code %s after %.0f s; restarting in %.0f s", name, code, lived, delay
        )
        return delay

    def due(self, now: float | None = None) -> list[str]:
        """Names whose restart time has come."""
        now = time.monotonic() if now is None else now
        return [n for n, t in self.tracks.items() if t.due is not None and t.due <= now]
