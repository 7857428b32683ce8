"""Several routers in front of one pool (docs/architecture.md §4, docs/deployment.md "Several
routers"): two real `nitsum-router` processes sharing a planning lease (a file lock, or etcd),
two real worker servers (echo backends) registered with both.

`kill -9` of the leader with streams open on both routers: every stream on the survivor ends
complete and exact, the client retries the cut ones on the survivor and is served, and the
survivor takes the lease and plans within 2 control windows. Then the deposed leader comes back
at its old address with a plan of its old term: every worker refuses it and keeps the new
leader's plan.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plane import bounded_run, wait
from several_routers import Deployment, Etcd, FakeLeader, Stream, echo, plan_of

pytestmark = pytest.mark.e2e

WINDOW_MS = 1000
TOKENS = 120  # per stream: 120 steps of 20 ms, long enough to be cut mid-way
PROMPTS = [[65 + (i + k) % 7 for k in range(5)] for i in range(8)]


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Every test is bounded (plane.bounded_run)."""
    with bounded_run(90):
        yield


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    if not Etcd.installed():
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    server = Etcd(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def kill_the_leader_under_load(d: Deployment, lease: str) -> int:
    """Routers a (leader) and b, 4 streams on each; `kill -9` a mid-stream; check b's streams,
    the retries and the failover. Returns a's term."""
    d.start(lease, WINDOW_MS)
    a, b = d.routers
    term_a = plan_of(a)["router"]["term"]
    # b follows a, and routes by a's plan (the same epoch, of a's term).
    wait(lambda: plan_of(b)["router"]["role"] == "follower", what="b follows")
    wait(lambda: plan_of(b)["epoch"] == plan_of(a)["epoch"], what="b takes a's plan")
    assert plan_of(b)["epoch"] >> 32 == term_a
    assert plan_of(a)["router"]["followers"].keys() == {"1"}
    on_b = [Stream(b.http, PROMPTS[i], TOKENS) for i in range(4)]
    on_a = [Stream(a.http, PROMPTS[4 + i], TOKENS) for i in range(4)]
    wait(lambda: all(s.chunks >= 2 for s in on_a + on_b), what="every stream streaming")
    t_kill = time.time()
    assert a.proc is not None
    a.proc.kill()
    a.proc.wait(5)
    for s in on_a + on_b:
        s.join(30)
    # The survivor's streams are untouched: complete and exact.
    for i, s in enumerate(on_b):
        assert (s.error, s.finish, s.ids) == (None, "length", echo(PROMPTS[i], TOKENS))
    # The leader's were cut; the client retries each on b and is served.
    assert all(s.finish is None for s in on_a), [(s.finish, s.error) for s in on_a]
    for i in range(4):
        assert b.generate(PROMPTS[4 + i], 20) == echo(PROMPTS[4 + i], 20)
    # b leads under a later term and planned within 2 windows of the kill; the workers run
    # its plan (their epochs carry its term).
    wait(lambda: plan_of(b)["router"]["role"] == "leader", what="b leads")
    role = plan_of(b)["router"]
    assert role["term"] > term_a
    first = min(t / 1e3 for t in role["planned_unix_ms"] if t / 1e3 >= t_kill)
    took = (role["leading_since_ms"] / 1e3 - t_kill, first - t_kill)
    print(
        f"\nfailover ({lease.split(':')[0]} lease, {WINDOW_MS} ms windows): lease taken after "
        f"{took[0] * 1e3:.0f} ms, planning resumed after {took[1] * 1e3:.0f} ms = "
        f"{took[1] * 1e3 / WINDOW_MS:.2f} windows"
    )
    assert took[1] <= 2 * WINDOW_MS / 1e3
    wait(
        lambda: all(
            e >> 32 == role["term"] for e in plan_of(b)["router"]["worker_epochs"].values()
        ),
        what="every worker on b's plan",
    )
    return term_a


def test_kill_9_the_leader_and_a_deposed_leader_cannot_roll_the_plan_back(
    deployment: Deployment, tmp_path: Path
) -> None:
    term_a = kill_the_leader_under_load(deployment, f"file:{tmp_path}/lease")
    a, b = deployment.routers
    assert deployment.workers is not None
    term_b = plan_of(b)["router"]["term"]
    fake = FakeLeader(a.addr)
    try:
        # The deposed leader, back at its endpoint, believes it still leads term_a.
        fake.serve((term_a << 32) + 99, workers=2)
        for w, ack in fake.acks.items():
            assert ack["ok"] is False, ack
            assert "older than the active epoch" in ack["error"], ack
            assert deployment.workers.servers[w].plan.epoch >> 32 == term_b
        assert b.generate(PROMPTS[0], 10) == echo(PROMPTS[0], 10)
        assert all(e >> 32 == term_b for e in plan_of(b)["router"]["worker_epochs"].values())
    finally:
        fake.close()


def test_kill_9_the_leader_with_an_etcd_lease(etcd: Etcd, deployment: Deployment) -> None:
    kill_the_leader_under_load(deployment, f"etcd:{etcd.url}/nitsum/test-{uuid.uuid4().hex}")
