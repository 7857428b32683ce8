"""A host worker whose device process stops (SIGSTOP) with requests in flight, against a fake
router: the device misses its step deadline, is killed (exit code -9) and reported lost
(`device_lost` with the hung reason) a moment after the deadline; its requests end without
an answer, for the router to resume; the healthy device's requests go on, never waiting on
the stopped one, and end with exactly the greedy answer."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time

import pytest

from nitsum.pool.step_deadline import StepDeadline
from nitsum.worker import protocol as proto
from test_device_loss import _arrival, _of, host  # noqa: F401 - `host` is a fixture
from test_host_worker import greedy, prompt, reference
from tiny import make_tiny

# Spawns device processes: out of the fast lane (scripts/test.sh --fast).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLOOR_S = 2.0  # the step deadline's floor in this test (`--device-step-timeout`)
REPORT_S = 2.0  # after the deadline, the device is reported lost within this
HEALTHY_GAP_S = 1.0  # the healthy device's longest wait between tokens (below the floor)


@pytest.fixture(scope="module")
def tiny():
    """Room for streams that outlast the stop (`host` runs on this model)."""
    return make_tiny("llama-long")


def _gaps(router, rid: str, since: float, until: float) -> list[float]:
    """Seconds between consecutive token messages of `rid` arriving in [since, until]."""
    times = [
        t
        for t, m in router.seen
        if m["type"] == "tokens" and m["request_id"] == rid and since <= t <= until
    ]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_a_stopped_device_is_killed_at_its_deadline_and_the_others_go_on(host, tiny):  # noqa: F811 - `host` is imported
    router, server, pe, pool = host
    pool.deadline = StepDeadline(FLOOR_S)
    reqs = {
        f"on{d}_{i}": (prompt(6 + 5 * i + d, seed=10 * d + i), greedy(450 if d == 0 else 200))
        for d in range(2)
        for i in range(2)
    }
    ref = reference(tiny, reqs)
    for rid, (ids, params) in reqs.items():
        router.send(proto.generate(rid, ids, params), rid[2].encode())
    victims = [rid for rid in reqs if rid.startswith("on1")]
    healthy = [rid for rid in reqs if rid.startswith("on0")]
    router.pump(lambda: all(len(router.tokens.get(r, [])) >= 3 for r in reqs))
    pid = pool.procs[1].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        router.pump(lambda: bool(_of(router, "device_lost")), timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it was killed, unless the test failed
            os.kill(pid, signal.SIGCONT)
    lost = _of(router, "device_lost")[0]
    arrived = _arrival(router, lost)
    assert lost["worker_id"] == 1
    match = re.fullmatch(
        r"device process hung: no step reply within ([0-9.]+) s \(killed\); exit code -9",
        lost["reason"],
    )
    assert match, lost["reason"]
    budget = float(match.group(1))
    assert FLOOR_S <= budget < FLOOR_S + 1.0, budget  # tiny steps: the floor, nearly
    assert FLOOR_S <= arrived - stopped < budget + REPORT_S

    # The stopped device's requests end without an answer; what they streamed is the greedy
    # answer's start.
    for rid in victims:
        assert rid not in router.finals, router.finals.get(rid)
        got = router.tokens[rid]
        assert got == ref[rid][: len(got)], rid

    # The healthy device kept stepping while the other was stopped: it never waited on it.
    router.pump(lambda: all(r in router.finals for r in healthy))
    for rid in healthy:
        assert router.tokens[rid] == ref[rid], rid
        assert router.finals[rid]["finish_reason"] == "length"
    window = [g for rid in healthy for g in _gaps(router, rid, stopped, arrived)]
    assert window, "the healthy device streamed nothing while the other was stopped"
    assert max(window) < HEALTHY_GAP_S, max(window)

    # It restarts alone and registers again; the pages of every group add up.
    router.pump(lambda: bool(_of(router, "register", since=arrived)), timeout=60)
    assert [m["worker_id"] for m in _of(router, "register", since=arrived)] == [1]
    for used, owned in pe.page_accounting().values():
        assert used == owned
