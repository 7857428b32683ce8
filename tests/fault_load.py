"""Concurrent streaming load for the fault suites: N greedy chat streams against a server,
each ending as "ok" (its full answer and `[DONE]`), "error" (an explicit OpenAI error: a 5xx
body or an SSE `error` event) or "lost" (anything else: a cut socket, a timeout, a stream
without `[DONE]`, a wrong token count).

NOTE: "lost" is what the fault suites must keep at 0; "error" is counted separately, since an
explicit error is what a client may see when no live device can take a request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT = "/v1/chat/completions"


def count_request(model: str, i: int, max_tokens: int = 24) -> dict[str, Any]:
    """Request `i`: greedy, streaming, exactly `max_tokens` tokens whatever they are."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


@dataclass
class LoadResult:
    """Per request: (kind, text or why); `streaming` lists requests that had a first token."""

    outcomes: dict[int, tuple[str, str]] = field(default_factory=dict)
    streaming: list[int] = field(default_factory=list)

    def counts(self, n: int) -> dict[str, int]:
        kinds = [self.outcomes.get(i, ("lost", "no outcome"))[0] for i in range(n)]
        return {k: kinds.count(k) for k in ("ok", "error", "lost")}

    def texts(self) -> dict[int, str]:
        return {i: t for i, (k, t) in self.outcomes.items() if k == "ok"}


def _stream_one(
    http: httpx.Client, body: dict[str, Any], i: int, res: LoadResult, lock: threading.Lock
) -> None:
    def record(kind: str, what: str) -> None:
        with lock:
            res.outcomes[i] = (kind, what)

    try:
        with http.stream("POST", CHAT, json=body) as r:
            if r.status_code != 200:
                r.read()
                record("error" if r.status_code >= 500 else "lost", f"{r.status_code} {r.text}")
                return
            text, done, first, finish = [], False, True, None
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    record("error", f"stream: {event['error'].get('message')}")
                    return
                for c in event.get("choices", []):
                    piece = (c.get("delta") or {}).get("content") or ""
                    if piece and first:
                        first = False
                        with lock:
                            res.streaming.append(i)
                    text.append(piece)
                    finish = c.get("finish_reason") or finish
        if not done or finish != "length":
            record("lost", f"stream ended without [DONE]/length (finish {finish})")
        else:
            record("ok", "".join(text))
    except Exception as e:  # resets, timeouts: lost, recorded per request
        record("lost", f"{type(e).__name__}: {e}")


def run_streams(
    base_url: str,
    api_key: str | None,
    bodies: list[dict[str, Any]],
    during: Callable[[LoadResult], None],
    timeout_s: float = 120.0,
) -> LoadResult:
    """Start every body as a stream at once, call `during(result)` (the fault: it may wait on
    `result.streaming`), then wait up to `timeout_s` for all of them."""
    res, lock = LoadResult(), threading.Lock()
    n = len(bodies)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    http = httpx.Client(
        base_url=base_url,
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(timeout_s, connect=5.0),
    )
    pool = ThreadPoolExecutor(max_workers=n)
    not_done: set = set()
    try:
        futures = [pool.submit(_stream_one, http, b, i, res, lock) for i, b in enumerate(bodies)]
        during(res)
        _, not_done = wait(futures, timeout=timeout_s)
    finally:
        http.close()  # closing the sockets makes any stuck thread return
        pool.shutdown(wait=True, cancel_futures=True)
    return res


def wait_until(what: str, cond: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """Poll `cond` until truthy; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
