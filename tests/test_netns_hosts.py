"""Several hosts as network namespaces (tests/netns.py): the router in one, two host workers
of 2 CPU devices each in two others, every link a veth; KV between the hosts over NIXL
(UCX over TCP, as between machines without RDMA). One deployment serves every scenario, in
file order:

1. P/D across the hosts with a TP-2 group on each gives the tokens of one host.
2. Host B's link goes down for 20 s while its requests stream and while a handoff to it is
   being read: the streams are held and complete; the handoff rolls back and host A decodes
   it. 0 lost.
3. Host B's processes are killed mid-stream: its requests resume on host A. 0 lost.

Skipped where namespaces cannot be made (not root, no iproute2), with the reason.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import netns
from nitsum.sampling import SamplingParams
from test_router_protocol import BIN
from test_xhost_pd import PAGE_TOKENS, SECRET, model_dir, prompt, reference, wait

__all__ = ["model_dir"]  # the fixture, shared with test_xhost_pd

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]

HTTP, ZMQ, KV = 8000, 5557, 29600  # fixed ports: the namespaces are new, nothing else listens
PLAN = [
    {"members": [0, 1], "role": "prefill"},  # host A: one TP-2 group
    {"members": [2, 3], "role": "decode"},  # host B: one TP-2 group
]
TIMEOUT_S = 5.0  # --kv-timeout-s: B gives up on a READ after it, A takes an offer back at 2x


@dataclass
class Deployment:
    hosts: netns.Hosts
    logs: Path
    stall: Path  # host B stalls before a READ while this file exists (NITSUM_TEST_KV_STALL_FILE)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    client: cf.ThreadPoolExecutor = field(init=False)
    tally: dict[str, int] = field(default_factory=lambda: {"tried": 0, "passed": 0, "lost": 0})

    def __post_init__(self) -> None:
        # NOTE: the client's threads live in the router's namespace (their sockets too).
        self.client = cf.ThreadPoolExecutor(8, initializer=self.hosts.enter, initargs=("r",))

    @property
    def base(self) -> str:
        return f"http://{self.hosts.addr['r']}:{HTTP}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def get(self, path: str) -> httpx.Response:
        return self.client.submit(httpx.get, f"{self.base}{path}", timeout=5).result()

    def generate(self, ids: list[int], n: int) -> cf.Future:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0},
        }
        return self.client.submit(httpx.post, f"{self.base}/generate", json=body, timeout=150)

    def stats(self) -> dict[tuple[str, str], float]:
        import re

        out = {}
        for m in re.finditer(
            r"nitsum_worker_stat\{([^}]*)\} ([0-9.e+-]+)", self.get("/metrics").text
        ):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["worker"], labels["name"])] = float(m.group(2))
        return out

    def settle(self, futures: dict[str, cf.Future], want: dict[str, list[int]]) -> dict[str, Any]:
        """Every request's answer (its tokens checked); counts tried / passed / lost."""
        got = {}
        for rid, f in futures.items():
            self.tally["tried"] += 1
            try:
                r = f.result(timeout=150)
                ok = r.status_code == 200 and r.json()["output_ids"] == want[rid]
            except Exception:  # noqa: BLE001 - a request that never answers is lost
                r, ok = None, False
            self.tally["passed" if ok else "lost"] += 1
            got[rid] = r.json() if r is not None and r.status_code == 200 else r
        assert self.tally["lost"] == 0, {k: v for k, v in got.items()}
        return got

    def kill(self, name: str) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the host worker and its device processes
        p.wait(10)


def _worker(d: Deployment, model: Path, host: str, first_id: int, rank: int) -> None:
    env = {
        **os.environ,
        "NITSUM_WORKER_SECRET": SECRET,
        "GLOO_SOCKET_IFNAME": "lo",  # the devices' collectives, inside the host
        "UCX_TLS": "tcp",  # KV between hosts over the veth, as between machines
        "UCX_NET_DEVICES": netns.IFACE,
        **({"NITSUM_TEST_KV_STALL_FILE": str(d.stall)} if host == "b" else {}),
    }
    argv = [
        sys.executable, "-m", "nitsum.worker", "--model", str(model), "--devices", "2",
        "--worker-id", str(first_id), "--router", f"tcp://{d.hosts.addr['r']}:{ZMQ}",
        "--served-model-name", "tiny", "--kv-cache-mb", "4", "--page-tokens", str(PAGE_TOKENS),
        "--kv-peers", f"tcp://{d.hosts.addr['a']}:{KV}", "--kv-rank", str(rank),
        "--kv-world", "2", "--kv-backend", "nixl", "--kv-timeout-s", str(TIMEOUT_S),
    ]  # fmt: skip
    d.procs[host] = subprocess.Popen(
        d.hosts.cmd(host, argv),
        env=env,
        stderr=open(d.logs / f"{host}.log", "w"),  # noqa: SIM115 - closed with the process
        start_new_session=True,  # NOTE: its own process group: a host kill takes the devices
    )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Deployment]:
    why = netns.unavailable()  # NOTE: here, not at import: it makes a namespace to find out
    if why is not None:
        pytest.skip(f"network namespaces: {why}")
    tmp = tmp_path_factory.mktemp("netns")
    (tmp / "logs").mkdir()
    (tmp / "router.json").write_text(json.dumps({"plan": PLAN}))
    hosts = netns.Hosts(["r", "a", "b"])
    d = Deployment(hosts, tmp / "logs", tmp / "stall-b")
    try:
        d.procs["r"] = subprocess.Popen(
            hosts.cmd(
                "r",
                [
                    str(BIN),
                    "--listen",
                    f"{hosts.addr['r']}:{HTTP}",
                    "--worker-addr",
                    f"tcp://{hosts.addr['r']}:{ZMQ}",
                    "--model-dir",
                    str(model_dir),
                    "--served-model-name",
                    "tiny",
                    "--config",
                    str(tmp / "router.json"),
                    "--heartbeat-timeout-ms",
                    "4000",
                    "--log-level",
                    "warn",
                ],
            ),  # fmt: skip
            env={**os.environ, "NITSUM_WORKER_SECRET": SECRET},
            stdout=(log := open(d.logs / "r.log", "w")),  # noqa: SIM115
            stderr=log,
            start_new_session=True,
        )
        _worker(d, model_dir, "a", 0, 0)
        _worker(d, model_dir, "b", 2, 1)

        def ready() -> bool:
            try:
                r = d.get("/health")
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and r.json().get("workers") == 4

        wait(ready, 120, "router healthy with the 4 devices of both hosts")
        wait(lambda: len(d.stats()) >= 2, 30, "both hosts' stats")
        yield d
    finally:
        for name in d.procs:
            d.kill(name)
        d.client.shutdown(wait=False, cancel_futures=True)
        hosts.close()
        print(f"\nnetns hosts: {d.tally}")  # tried / passed / lost, for the record


def _reqs(seed: int, n: int, tokens: int) -> dict[str, tuple[list[int], SamplingParams]]:
    sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    return {f"r{seed}-{i}": (prompt(7 + 5 * i, seed + i), sp) for i in range(n)}


def _run(d: Deployment, reqs: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, cf.Future]:
    return {rid: d.generate(ids, sp.max_tokens) for rid, (ids, sp) in reqs.items()}


def test_pd_across_hosts_with_tp_groups_gives_the_tokens_of_one_host(
    deployment: Deployment, model_dir: Path
) -> None:
    d = deployment
    assert "KV transport over NIXL" in d.log("a") and "KV transport over NIXL" in d.log("b")
    reqs = _reqs(100, 4, 12)
    want = reference(model_dir, reqs)
    d.settle(_run(d, reqs), want)
    done = {("0", "kv_remote_out"): 4.0, ("2", "kv_remote_in"): 4.0}
    stats = wait(
        lambda: (s := d.stats()) and all(s.get(k) == v for k, v in done.items()) and s,
        10,
        "both hosts' handoff counters",
    )
    assert stats[("0", "kv_remote_failed")] == 0
    per_token = 2 * 2 * 4 * 8 * 4  # layers x K,V x KV heads x head dim x fp32
    assert stats[("0", "kv_remote_bytes")] == per_token * sum(len(i) for i, _ in reqs.values())


def test_a_host_link_down_20s_holds_its_streams_and_rolls_back_a_handoff_mid_transfer(
    deployment: Deployment, model_dir: Path
) -> None:
    d = deployment
    streams = _reqs(200, 3, 150)
    caught = _reqs(300, 1, 20)
    want = reference(model_dir, {**streams, **caught})
    futures = _run(d, streams)
    wait(lambda: d.log("b").count("reading KV of") >= 4 + 3, 60, "B adopting the streams")
    d.stall.write_text("2")  # B's next READ waits 2 s: the link goes down in between
    futures |= _run(d, caught)
    wait(lambda: "test stall" in d.log("b"), 30, "a handoff to B under way")
    d.hosts.link("b", up=False)
    time.sleep(20)
    d.hosts.link("b", up=True)
    d.stall.unlink()
    got = d.settle(futures, want)
    assert all(g["meta_info"]["finish_reason"]["type"] == "length" for g in got.values())
    # The handoff cut mid-transfer: B dropped it, A took it back and decoded it.
    assert "handoff of" in d.log("b") and "dropped, its sender decodes it" in d.log("b")
    assert "rolled back" in d.log("a")
    # Only host B went silent: A heartbeats on while its offer to B waits for its deadline.
    assert "WorkerId(2)" in d.log("r") and "WorkerId(0)" not in d.log("r")
    stats = wait(
        lambda: (s := d.stats()).get(("0", "kv_remote_failed"), 0) >= 1 and s, 15, "A's stats"
    )
    assert stats[("0", "kv_remote_out")] >= 4 + 3


def test_a_killed_host_loses_no_request_its_streams_resume_on_the_other(
    deployment: Deployment, model_dir: Path
) -> None:
    d = deployment
    # Host B back from scenario 2 (its heartbeats heard again): all 4 devices healthy.
    wait(lambda: d.get("/health").json().get("workers") == 4, 60, "host B live again")
    streams = _reqs(400, 3, 150)
    want = reference(model_dir, streams)
    before = d.log("b").count("reading KV of")
    futures = _run(d, streams)
    wait(
        lambda: d.log("b").count("reading KV of") >= before + 3,
        60,
        f"B adopting the streams (health {d.get('/health').json()})",
    )
    time.sleep(0.5)  # mid-stream
    d.kill("b")
    got = d.settle(futures, want)
    assert all(g["meta_info"]["finish_reason"]["type"] == "length" for g in got.values())
    # Host B is gone for good; host A serves on, P/D or not.
    again = _reqs(500, 1, 8)
    d.settle(_run(d, again), reference(model_dir, again))
