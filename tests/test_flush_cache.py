"""`/flush_cache` (SGLang) and `/reset_prefix_cache` (vLLM): the router tells every worker
(`flush_cache`, docs/protocol.md), which drops its prefix caches' pages that no running
request holds. The engine's part on a tiny model, then the real router and worker server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nitsum.engine.request_spec import RequestSpec
from plane import EchoBackend, RealWorker, Router, wait
from test_prefix_cache import GREEDY, engine_for, serve
from test_prefix_cache import tiny as tiny  # noqa: F401 (fixture)
from test_router_protocol import BIN
from tiny import random_prompt as history


def step(engine) -> list[int]:
    """One engine step: the tokens it produced."""
    batch = engine.begin_step()
    return [
        t for o in engine.end_step(batch, engine.runner.run(batch), 0.0) for t in o.new_token_ids
    ]


def test_a_flush_frees_idle_cached_pages_and_keeps_a_running_requests(tiny) -> None:  # noqa: F811
    hf, cfg = tiny
    engine = engine_for(tiny)
    total = engine.pages.num_free
    turn = history(cfg, 37, seed=1)
    out, computed = serve(engine, "t1", turn)
    cached = engine.num_evictable()
    assert computed == 37 and cached == 10  # 37 + 5 tokens of KV: 10 full pages
    assert engine.flush_prefix_cache() == cached
    assert engine.num_evictable() == 0 and engine.pages.num_free == total
    # Nothing is reused after the flush: the same prompt computes all of it, same answer.
    again, computed = serve(engine, "t2", turn)
    assert (again, computed) == (out, 37)
    # A running request holds the 9 cached pages of its prompt: they stay, the 10th goes.
    engine.add_request("t3", turn, RequestSpec(GREEDY))
    batch = engine.begin_step()
    got = [
        t for o in engine.end_step(batch, engine.runner.run(batch), 0.0) for t in o.new_token_ids
    ]
    assert engine.flush_prefix_cache() == 1
    while engine.has_unfinished():
        batch = engine.begin_step()
        got += [
            t
            for o in engine.end_step(batch, engine.runner.run(batch), 0.0)
            for t in o.new_token_ids
        ]
    assert got == out


class FlushCountingBackend(EchoBackend):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush_prefix_cache(self) -> int:
        self.flushes += 1
        return 0


@pytest.fixture()
def plane(tmp_path: Path) -> Iterator[tuple[Router, FlushCountingBackend]]:
    if not BIN.exists():
        pytest.skip(f"{BIN} not built")
    keys = [{"key": "admin-key", "admin": True}, {"key": "user-key"}]
    router = Router(tmp_path, {"api_keys": keys})
    worker = RealWorker(router)
    backend = FlushCountingBackend()
    worker.server.backend = backend
    try:
        yield router, backend
    finally:
        worker.stop()
        router.stop()


@pytest.mark.e2e
def test_flush_cache_and_reset_prefix_cache_reach_every_worker_with_an_admin_key(plane) -> None:
    router, backend = plane

    def post(path: str, key: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{router.http}{path}", headers=headers, timeout=5)

    for path in ("/flush_cache", "/reset_prefix_cache"):
        assert post(path, None).status_code == 401
        assert post(path, "user-key").status_code == 403
    assert backend.flushes == 0
    for path in ("/flush_cache", "/reset_prefix_cache"):
        r = post(path, "admin-key")
        assert r.status_code == 200, r.text
        assert r.json() == {"workers": 1}
    wait(lambda: backend.flushes == 2, what="both flushes reached the worker")
