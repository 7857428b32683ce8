"""A long engine step is not silence: the worker's heartbeats keep coming while it runs
(worker/heartbeat.py), so the router never takes a slow worker for a stalled one."""

from __future__ import annotations

import time
from dataclasses import replace

from nitsum.worker import protocol as proto
from test_worker_server import (  # noqa: F401 (fixtures)
    GREEDY,
    engine_of,
    prompt,
    registered,
    solo,
    tiny,
    worker,
)

STEP_S = 1.0  # each forward sleeps this long: 5x the heartbeat period below
BEAT_S = 0.2


def test_heartbeats_keep_coming_during_a_step_longer_than_the_timeout(worker, tiny):  # noqa: F811
    router, server, _ = registered(worker)
    runner = server.backend.pe.pool.runner  # the in-process device's
    real = runner.forward

    def slow(inputs):
        time.sleep(STEP_S)
        return real(inputs)

    runner.forward = slow
    params = replace(GREEDY, max_tokens=3)
    ids = prompt(5, seed=3)
    t0 = time.monotonic()
    router.send(proto.generate("slow", ids, params))
    got = router.collect({"slow"}, timeout=30.0)["slow"]
    t1 = time.monotonic()
    # The request still streams exactly the solo greedy tokens.
    assert [t for m in got for t in m["token_ids"]] == solo(tiny, ids, params)
    assert got[-1]["finish_reason"] == "length"
    assert t1 - t0 > 3 * STEP_S
    # Heartbeats all along: never a gap near a step's length, however long the steps are.
    beats = [t for t, m in router.seen if m["type"] == "heartbeat" and t0 <= t <= t1]
    edges = [t0, *beats, t1]
    gaps = [b - a for a, b in zip(edges, edges[1:], strict=False)]
    assert len(beats) >= int((t1 - t0) / BEAT_S) // 2, (len(beats), t1 - t0)
    assert max(gaps) < STEP_S / 2, gaps
    # Those came from the heartbeat thread (the loop was inside the step), with the epoch.
    assert server.heartbeats.sent >= 3 * int(STEP_S / BEAT_S) - 3
    during = [m for t, m in router.seen if m["type"] == "heartbeat" and t0 <= t <= t1]
    assert {(m["epoch"], m["worker_id"]) for m in during} == {(1, 0)}
    # And they carry the load of the latest step, not the one before the request came: after
    # the thread resent an old beat, the loop sends a fresh one between steps (with every
    # step longer than the timer, the thread's resends would otherwise be all the router sees).
    assert any(m["running"] == 1 for m in during), [m["running"] for m in during]
    # Between steps the loop sends them itself again, with the load.
    runner.forward = real
    server.heartbeats.sent = 0
    beat = router.expect("heartbeat")
    assert (beat["running"], beat["waiting"]) == (0, 0)
    assert beat["free_pages"] == engine_of(server).pages.num_pages
