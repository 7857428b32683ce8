"""Worker restarts by `nitsum serve`: backoff doubles while a worker keeps dying quickly,
is capped, and resets once a worker has lived long enough."""

from nitsum.worker.supervise import Restarts


def test_backoff_doubles_on_quick_deaths_caps_and_resets_after_a_long_life() -> None:
    r = Restarts(base_s=1.0, max_s=8.0, healthy_s=60.0)
    r.started("w", now=0.0)
    delays = []
    t = 0.0
    for _ in range(6):
        t += 5.0  # dies 5 s after each start
        delays.append(r.exited("w", 1, now=t))
        assert r.due(now=t) == []
        t += delays[-1]
        assert r.due(now=t) == ["w"]
        r.started("w", now=t)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    # A worker that served for an hour and was killed comes back after the base delay.
    assert r.exited("w", -9, now=t + 3600.0) == 1.0


def test_an_exit_seen_on_every_poll_is_scheduled_once() -> None:
    r = Restarts(base_s=1.0)
    r.started("a", now=0.0)
    r.started("b", now=0.0)
    assert r.exited("a", 1, now=10.0) == 1.0
    assert r.exited("a", 1, now=10.5) == 0.5  # the same exit, polled again
    assert r.due(now=10.9) == []
    assert r.due(now=11.0) == ["a"]
    r.started("a", now=11.0)
    assert r.due(now=12.0) == []
