"""P/D across host worker processes: the real router, real `nitsum worker` processes joined by
the gloo KV transport (pool/peers.py, the fallback where NIXL cannot load: `--kv-backend
gloo`) on loopback, a tiny random model. Over NIXL, between network namespaces:
tests/test_netns_hosts.py.

A request prefilled in one process decodes in another with the tokens of a mixed run (greedy
and seeded), and killing either the prefill or the decode process in the middle of a handoff
loses no request.
Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.local import open_local_engine
from nitsum.sampling import SamplingParams
from test_router_protocol import BIN, EOS, free_port, write_tiny_model
from tiny import random_llama

SECRET = "xhost-test-secret-0123456789abcdef"
PAGE_TOKENS = 4
# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]


def wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout} s"
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama (vocabulary over the router's byte tokenizer) with that tokenizer."""
    d = tmp_path_factory.mktemp("xhost-model")
    write_tiny_model(d)
    hf, _ = random_llama(64, 2, kv_heads=4, vocab=320, max_positions=256)
    hf.save_pretrained(d, safe_serialization=True)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
    return d


@dataclass
class Cluster:
    """The router and its host worker processes (one device each)."""

    base: str
    logs: Path
    workers: dict[int, subprocess.Popen] = field(default_factory=dict)
    router: subprocess.Popen | None = None

    def log(self, worker: int) -> str:
        return (self.logs / f"worker{worker}.log").read_text(errors="replace")

    def generate(self, ids: list[int], n: int, **sampling: Any) -> dict[str, Any]:
        body = {
            "input_ids": ids,
            "tier": "strict",
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True, **sampling},
        }
        r = httpx.post(f"{self.base}/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def stats(self) -> dict[tuple[str, str], float]:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        out = {}
        for m in re.finditer(r"nitsum_worker_stat\{([^}]*)\} ([0-9.e+-]+)", text):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["worker"], labels["name"])] = float(m.group(2))
        return out

    def stop(self) -> None:
        for p in [*self.workers.values(), self.router]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers.values(), self.router]:
            if p is None:
                continue
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def start(tmp: Path, model: Path, plan: list[dict], env: dict[int, dict[str, str]]) -> Cluster:
    """The router with the static `plan`, then one worker process per plan device, all on
    one KV transport (worker 1 is rank 0: it hosts the rendezvous)."""
    http, zport, kport = free_port(), free_port(), free_port()
    config = tmp / "router.json"
    config.write_text(json.dumps({"plan": plan}))
    logs = tmp / "logs"
    logs.mkdir()
    cluster = Cluster(f"http://127.0.0.1:{http}", logs)
    base_env = {**os.environ, "NITSUM_WORKER_SECRET": SECRET, "GLOO_SOCKET_IFNAME": "lo"}
    cluster.router = subprocess.Popen(
        [
            str(BIN),
            "--listen",
            f"127.0.0.1:{http}",
            "--worker-addr",
            f"tcp://127.0.0.1:{zport}",
            "--model-dir",
            str(model),
            "--served-model-name",
            "tiny",
            "--config",
            str(config),
            "--heartbeat-timeout-ms",
            "4000",
            "--log-level",
            "warn",
        ],
        env=base_env,
        stderr=open(logs / "router.log", "w"),  # noqa: SIM115 - closed with the process
    )
    n = sum(len(g["members"]) for g in plan)
    ranks = [1, 0, *range(2, n)]  # worker id -> transport rank
    try:
        for w in range(n):
            cmd = [
                sys.executable,
                "-m",
                "nitsum.worker",
                "--model",
                str(model),
                "--worker-id",
                str(w),
                "--router",
                f"tcp://127.0.0.1:{zport}",
                "--served-model-name",
                "tiny",
                "--kv-cache-mb",
                "4",
                "--page-tokens",
                str(PAGE_TOKENS),
                "--threads",
                "1",
                "--kv-peers",
                f"tcp://127.0.0.1:{kport}",
                "--kv-rank",
                str(ranks[w]),
                "--kv-world",
                str(n),
                "--kv-timeout-s",
                "5",
                # NOTE: the gloo fallback's tests; NIXL's: tests/test_netns_hosts.py.
                "--kv-backend",
                "gloo",
            ]
            cluster.workers[w] = subprocess.Popen(
                cmd,
                env={**base_env, **env.get(w, {})},
                stderr=open(logs / f"worker{w}.log", "w"),  # noqa: SIM115
            )

        def ready() -> bool:
            try:
                r = httpx.get(f"{cluster.base}/health", timeout=2)
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and r.json().get("workers") == n

        wait(ready, 90, "router healthy with every worker")
        wait(lambda: len(cluster.stats()) >= n, 30, "every worker's stats")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture()
def cluster(request: pytest.FixtureRequest, tmp_path: Path, model_dir: Path) -> Iterator[Cluster]:
    plan, env = request.param
    c = start(tmp_path, model_dir, plan, env)
    yield c
    c.stop()


def reference(
    model: Path, reqs: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, list[int]]:
    """Tokens of a mixed run: one in-process engine serves each request from start to end."""
    pe = open_local_engine(model, EngineConfig(kv_cache_bytes=4 << 20, page_tokens=PAGE_TOKENS))
    for rid, (ids, sp) in reqs.items():
        pe.add_request(rid, ids, RequestSpec(sp))
    out: dict[str, list[int]] = {rid: [] for rid in reqs}
    for _ in range(500):
        if not pe.has_unfinished():
            break
        for o in pe.step():
            out[o.request_id] += o.new_token_ids
    pe.pool.close()
    return out


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


PD = [{"members": [0], "role": "prefill"}, {"members": [1], "role": "decode"}]


@pytest.mark.parametrize("cluster", [(PD, {})], indirect=True)
def test_prefilled_on_host_a_decodes_on_host_b_with_the_tokens_of_a_mixed_run(
    cluster: Cluster, model_dir: Path
) -> None:
    reqs = {
        "greedy-short": (
            prompt(5, 1),
            SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
        ),
        "greedy-long": (
            prompt(37, 2),
            SamplingParams(max_tokens=9, temperature=0, ignore_eos=True),
        ),
        # The sampler's RNG state travels with the KV: seeded sampling repeats exactly.
        "seeded": (
            prompt(20, 3),
            SamplingParams(max_tokens=8, temperature=0.9, seed=11, ignore_eos=True),
        ),
    }
    want = reference(model_dir, reqs)
    # `--kv-backend gloo`: the fallback joined, NIXL not even tried.
    assert all("KV transport: rank" in cluster.log(w) for w in cluster.workers)
    assert not any("NIXL" in cluster.log(w) for w in cluster.workers)
    got = {}
    for rid, (ids, sp) in reqs.items():
        extra = {"seed": sp.seed} if sp.seed is not None else {}
        got[rid] = cluster.generate(ids, sp.max_tokens, temperature=sp.temperature, **extra)
    assert {rid: g["output_ids"] for rid, g in got.items()} == want
    assert all(g["meta_info"]["finish_reason"]["type"] == "length" for g in got.values())
    # Every request left process A after its prefill and was adopted by process B.
    # (stats ride each process's heartbeats: wait for ones sent after the last handoff)
    done = {("0", "kv_remote_out"): len(reqs), ("1", "kv_remote_in"): len(reqs)}

    def settled() -> dict[tuple[str, str], float] | None:
        s = cluster.stats()
        return s if all(s.get(k) == v for k, v in done.items()) else None

    stats = wait(settled, 10, "both hosts' stats")
    assert stats.get(("1", "kv_remote_out"), 0) == 0 and stats[("0", "kv_remote_failed")] == 0
    # KV bytes: 2 layers x K,V x 4 heads x 8 dims x 4 bytes per prompt token.
    per_token = 2 * 2 * 4 * 8 * 4
    assert stats[("0", "kv_remote_bytes")] == per_token * sum(len(i) for i, _ in reqs.values())


KILL = (
    [
        {"members": [0], "role": "prefill", "tiers": ["strict"]},
        {"members": [1], "role": "decode", "tiers": ["strict"]},
        {"members": [2], "role": "mixed", "tiers": ["relaxed"]},
    ],
    # Process A stalls between a handoff's metadata and its KV: the test kills it there.
    {0: {"NITSUM_TEST_KV_STALL_S": "30"}},
)


@pytest.mark.parametrize("cluster", [KILL], indirect=True)
def test_a_host_that_dies_mid_transfer_loses_no_request(cluster: Cluster, model_dir: Path) -> None:
    import concurrent.futures as cf

    reqs = {
        f"r{i}": (
            prompt(6 + 5 * i, 20 + i),
            SamplingParams(max_tokens=7, temperature=0, ignore_eos=True),
        )
        for i in range(3)
    }
    want = reference(model_dir, reqs)
    with cf.ThreadPoolExecutor(len(reqs)) as pool:
        futures = {
            rid: pool.submit(cluster.generate, ids, sp.max_tokens, temperature=0)
            for rid, (ids, sp) in reqs.items()
        }
        wait(lambda: "sending KV of" in cluster.log(0), 30, "a handoff under way on host A")
        cluster.workers[0].kill()  # mid-transfer: metadata sent, KV not
        got = {rid: f.result(timeout=60) for rid, f in futures.items()}
    assert {rid: g["output_ids"] for rid, g in got.items()} == want
    # The survivor dropped the partial handoff after its timeout and serves on.
    wait(lambda: "dropped" in cluster.log(1), 15, "host B dropping the partial handoff")
    assert cluster.workers[1].poll() is None and cluster.workers[2].poll() is None
    again = cluster.generate(reqs["r0"][0], 7, temperature=0)
    assert again["output_ids"] == want["r0"]


# Process A stalls 2 s (under the router's heartbeat timeout) between a handoff's metadata and
# its KV: the test kills the decode process B there.
KILL_DECODE = (KILL[0], {0: {"NITSUM_TEST_KV_STALL_S": "2"}})


@pytest.mark.parametrize("cluster", [KILL_DECODE], indirect=True)
def test_a_decode_host_that_dies_mid_transfer_loses_no_request(
    cluster: Cluster, model_dir: Path
) -> None:
    import concurrent.futures as cf

    reqs = {
        f"d{i}": (
            prompt(9 + 4 * i, 40 + i),
            SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
        )
        for i in range(3)
    }
    want = reference(model_dir, reqs)
    with cf.ThreadPoolExecutor(len(reqs)) as pool:
        futures = {
            rid: pool.submit(cluster.generate, ids, sp.max_tokens, temperature=0)
            for rid, (ids, sp) in reqs.items()
        }
        wait(lambda: "sending KV of" in cluster.log(0), 30, "a handoff under way on host A")
        cluster.workers[1].kill()  # the receiver, mid-transfer
        got = {rid: f.result(timeout=60) for rid, f in futures.items()}
    assert {rid: g["output_ids"] for rid, g in got.items()} == want
    # A's send failed, so A decoded its requests itself; B adopted none.
    # (stats ride the heartbeats: wait for one sent after the failure)
    stats = wait(
        lambda: (s := cluster.stats()).get(("0", "kv_remote_failed"), 0) >= 1 and s,
        10,
        "host A's stats",
    )
    assert stats[("0", "kv_remote_out")] == 0
    assert cluster.workers[0].poll() is None
