"""Replay a trace on time against an OpenAI-compatible `/v1/completions` endpoint.

Each request is sent at its trace arrival time with `stream=true`, a prompt of random token
ids of the requested length, `max_tokens` = the requested output length and `ignore_eos`, so
the server does exactly the work the trace describes. The client records when each request
was sent, when each streamed chunk arrived and when the stream ended.

Bounded by construction: a concurrency cap (requests beyond it wait client-side, visible as
send lag), a per-request timeout and a global deadline after which everything still pending
is cancelled. Every request ends with exactly one record.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from nitsum.bench.planlog import poll_plan
from nitsum.bench.record import RequestRecord
from nitsum.bench.traces import TraceRequest

TIER_HEADER = "x-nitsum-tier"


@dataclass(slots=True)
class ReplayConfig:
    """How to reach the server and how to bound the run."""

    url: str  # the completions endpoint, e.g. http://127.0.0.1:8000/v1/completions
    model: str | None = None  # omitted from the body when None
    api_key: str | None = None
    token_id_range: tuple[int, int] = (1000, 20000)  # prompt ids drawn from [lo, hi)
    seed: int = 0
    concurrency: int = 256
    request_timeout_s: float = 300.0
    # Global deadline in seconds from the start; None: last arrival + request timeout + 10 s.
    deadline_s: float | None = None
    connect_timeout_s: float = 10.0
    plan_url: str | None = None  # poll the router's /admin/plan during the run when set
    plan_interval_s: float = 0.5


@dataclass(slots=True)
class ReplayResult:
    records: list[RequestRecord]
    wall_s: float
    plan_log: list[dict[str, Any]] = field(default_factory=list)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process: building one costs ~0.1 s and every client needs one."""
    return httpx.create_ssl_context()


def completions_url(base: str) -> str:
    """`http://h:p` or `http://h:p/v1` → `http://h:p/v1/completions`; a full URL is kept."""
    base = base.rstrip("/")
    if base.endswith("/completions"):
        return base
    return base + ("/completions" if base.endswith("/v1") else "/v1/completions")


def make_prompt(index: int, length: int, seed: int, id_range: tuple[int, int]) -> list[int]:
    """Token ids for request `index`: deterministic in (seed, index), independent of timing."""
    rng = random.Random(seed * 1_000_003 + index)
    lo, hi = id_range
    # NOTE: `choices` is ~3x cheaper than a randrange loop; this runs on the event loop at send
    # time, so its cost shows up as send lag at high rates.
    return rng.choices(range(lo, hi), k=length)


def build_request(
    index: int, req: TraceRequest, cfg: ReplayConfig
) -> tuple[dict[str, Any], dict[str, str]]:
    """The JSON body and headers of one completion request."""
    body: dict[str, Any] = {
        "prompt": make_prompt(index, req.input_len, cfg.seed, cfg.token_id_range),
        "max_tokens": req.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if cfg.model is not None:
        body["model"] = cfg.model
    headers = {}
    if req.tier is not None:
        headers[TIER_HEADER] = req.tier
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    return body, headers


async def _stream_one(
    client: httpx.AsyncClient,
    cfg: ReplayConfig,
    req: TraceRequest,
    rec: RequestRecord,
    clock: Callable[[], float],
) -> None:
    """Send one request and fill `rec` from its SSE stream."""
    body, headers = build_request(rec.index, req, cfg)
    rec.send_s = clock()
    usage_tokens: int | None = None
    async with client.stream("POST", cfg.url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            text = " ".join((await resp.aread()).decode(errors="replace").split())
            rec.error = f"HTTP {resp.status_code}: {text[:300]}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now = clock()
            chunk = json.loads(data)
            if "error" in chunk:
                rec.error = f"server error: {json.dumps(chunk['error'])[:300]}"
                return
            usage = chunk.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = int(usage["completion_tokens"])
            for choice in chunk.get("choices") or []:
                # A chunk is a token unless it only carries the finish reason: a token whose
                # text is still held back by the detokenizer arrives with empty text.
                if choice.get("text") or choice.get("finish_reason") is None:
                    if rec.first_token_s is None:
                        rec.first_token_s = now
                    rec.last_token_s = now
                    rec.chunk_times.append(now)
    rec.done_s = clock()
    if not rec.chunk_times:
        rec.error = "stream ended without any token"
    rec.n_out = usage_tokens if usage_tokens is not None else len(rec.chunk_times)


async def replay(
    reqs: list[TraceRequest],
    cfg: ReplayConfig,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> ReplayResult:
    """Replay `reqs` (arrival order) and return one record per request, in trace order."""
    records = [
        RequestRecord(i, r.tier, r.input_len, r.output_len, r.arrival_s) for i, r in enumerate(reqs)
    ]
    last_arrival = max((r.arrival_s for r in reqs), default=0.0)
    deadline = cfg.deadline_s
    if deadline is None:
        deadline = last_arrival + cfg.request_timeout_s + 10.0
    t0 = 0.0  # set once the clients exist, so their setup is not counted as send lag

    def clock() -> float:
        return time.perf_counter() - t0

    sem = asyncio.Semaphore(cfg.concurrency)
    limits = httpx.Limits(
        max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency
    )
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
    tasks: list[asyncio.Task[None]] = []
    plan_log: list[dict[str, Any]] = []
    stop_plan = asyncio.Event()

    async def one(i: int) -> None:
        rec = records[i]
        async with sem:
            try:
                async with asyncio.timeout(cfg.request_timeout_s):
                    await _stream_one(client, cfg, reqs[i], rec, clock)
            except TimeoutError:
                rec.error = f"timeout after {cfg.request_timeout_s:g} s"
            except Exception as e:
                # NOTE: deliberately broad: transport failures, malformed chunks or anything
                # else fail this request only; one bad response must not end the whole run.
                rec.error = f"{type(e).__name__}: {e}"[:300]
        if on_done is not None:
            on_done(rec)

    async def drive() -> None:
        for i in sorted(range(len(reqs)), key=lambda k: reqs[k].arrival_s):
            delay = reqs[i].arrival_s - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)

    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout, verify=_tls_context()) as client,
        httpx.AsyncClient(
            timeout=max(cfg.plan_interval_s, 1.0), verify=_tls_context()
        ) as plan_client,
    ):
        t0 = time.perf_counter()
        plan_task = None
        if cfg.plan_url:
            plan_task = asyncio.create_task(
                poll_plan(
                    plan_client, cfg.plan_url, clock, cfg.plan_interval_s, stop_plan, plan_log
                )
            )
        try:
            async with asyncio.timeout(deadline):
                await drive()
        except TimeoutError:
            pass
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            stop_plan.set()
            if plan_task is not None:
                await plan_task
    wall = clock()
    for rec in records:
        if rec.error is None and not rec.ok:
            what = "not sent" if rec.send_s is None else "cancelled"
            rec.error = f"{what}: global deadline {deadline:g} s"
            if on_done is not None:
                on_done(rec)
    return ReplayResult(records, wall, plan_log)


def run_replay(
    reqs: list[TraceRequest],
    cfg: ReplayConfig,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> ReplayResult:
    """Synchronous wrapper around `replay`."""
    return asyncio.run(replay(reqs, cfg, on_done))
