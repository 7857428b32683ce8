"""Soak: rounds of requests cut mid-stream (and short ones that finish) on a 2-device pool
whose prefix cache spills to the host KV tier; the device processes' RSS levels off (the
host tier is committed when it is made, kv/host_tier.py, not page by page as it fills).

Bounded: 8 rounds of 16 requests on the tiny model (about 30 s)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.pool_engine import PoolEngine
from shapes import layout
from test_host_worker import greedy, prompt
from tiny import POOL_ECFG, POOL_PAGES, make_tiny, tiny_device_pool

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUNDS, PER_ROUND = 8, 16
HOST_MIB = 8
# Growth allowed from the end of round 2 to the end (the host tier lazily committed grew
# 2.3 MiB over those rounds here, 0.3-0.5 MiB each, until it would have been full).
LEVEL_MIB = 1.0


def _rss_mib(pid: int | None) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_device_rss_levels_off_over_rounds_of_cut_streams():
    tiny = make_tiny("llama-long")
    ecfg = replace(POOL_ECFG, host_kv_cache_bytes=HOST_MIB << 20)
    with tiny_device_pool(tiny, ecfg, devices=2, levels=(1, 2)) as pool:
        pe = PoolEngine(pool, tiny[1], ecfg, POOL_PAGES, layout((0,), (1,)))
        rss: list[list[float]] = []
        for r in range(ROUNDS):
            ids = []
            for i in range(PER_ROUND):
                rid = f"r{r}_{i}"
                tokens = 3 if i % 2 else 200  # half finish, half are cut mid-stream
                pe.add_request(rid, prompt(120, seed=1000 * r + i), RequestSpec(greedy(tokens)))
                ids.append(rid)
            for _ in range(12):
                pe.step()
            for rid in ids:
                pe.abort(rid)
            while pe.has_unfinished():
                pe.step()
            rss.append([_rss_mib(p.pid) for p in pool.procs])
        for used, owned in pe.page_accounting().values():
            assert used == owned
        host = sum(e.num_host_cached() for _, e in pe.every_engine())
        print("RSS MiB per round:", [[round(x, 1) for x in row] for row in rss], "host", host)
        assert host > 0, "the prefix cache never spilled to the host tier"
        for d in range(2):
            growth = max(row[d] for row in rss[1:]) - rss[1][d]
            assert growth < LEVEL_MIB, (d, [row[d] for row in rss])
