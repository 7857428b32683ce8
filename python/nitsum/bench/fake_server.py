"""A tiny fake OpenAI-compatible streaming server with known timings, for tests and dry runs.

`POST /v1/completions` (stream) waits `ttft_s`, then streams `max_tokens` chunks `tpot_s`
apart, then a usage chunk (when asked for and `usage` is on) and `[DONE]`. It also serves
`GET /v1/models` and a changing `GET /admin/plan`. It runs on 127.0.0.1 at a random port in a
background thread and records what it received.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAIServer:
    """Use as a context manager: `with FakeOpenAIServer(ttft_s=0.05) as srv: srv.url`.

    Requests whose `x-nitsum-tier` is in `hang_tiers` never answer (until the server stops);
    requests whose tier is in `fail_tiers` get HTTP 503; those in `garbage_tiers` get one
    token and then a chunk that is not JSON.
    """

    def __init__(
        self,
        ttft_s: float = 0.05,
        tpot_s: float = 0.01,
        usage: bool = True,
        hang_tiers: frozenset[str] = frozenset(),
        fail_tiers: frozenset[str] = frozenset(),
        garbage_tiers: frozenset[str] = frozenset(),
    ) -> None:
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self.usage = usage
        self.hang_tiers = hang_tiers
        self.fail_tiers = fail_tiers
        self.garbage_tiers = garbage_tiers
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.plan_polls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        # A short poll interval makes `shutdown` (which waits for the next poll) quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def plan(self) -> dict[str, Any]:
        """Epoch advances every other poll; the pool flips between 2×TP1 and 1×TP2."""
        with self._lock:
            self.plan_polls += 1
            epoch = self.plan_polls // 2
        if epoch % 2 == 0:
            groups = [
                {"members": [0], "tp": 1, "role": "prefill", "tiers": ["strict"]},
                {"members": [1], "tp": 1, "role": "decode", "tiers": ["strict"]},
            ]
        else:
            groups = [{"members": [0, 1], "tp": 2, "role": "mixed", "tiers": ["strict"]}]
        return {"epoch": epoch, "groups": groups}

    def stream(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        """Write one streamed completion to `handler`."""
        tier = handler.headers.get("x-nitsum-tier")
        if tier in self.fail_tiers:
            handler.send_error(503, "overloaded")
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        if tier in self.hang_tiers:
            self._stop.wait()
            return
        n = int(body.get("max_tokens", 16))
        for k in range(n):
            if self._stop.wait(self.ttft_s if k == 0 else self.tpot_s):
                return
            finish = "length" if k == n - 1 else None
            chunk = {"choices": [{"index": 0, "text": f"t{k}", "finish_reason": finish}]}
            handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if tier in self.garbage_tiers:
                handler.wfile.write(b"data: {not json\n\n")
                return
        if self.usage and (body.get("stream_options") or {}).get("include_usage"):
            prompt_len = len(body.get("prompt") or [])
            usage = {"prompt_tokens": prompt_len, "completion_tokens": n}
            last = {"choices": [], "usage": usage | {"total_tokens": prompt_len + n}}
            handler.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
        handler.wfile.write(b"data: [DONE]\n\n")


def _make_handler(srv: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            pass  # keep test output clean

        def _json(self, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            if self.path == "/v1/models":
                self._json({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            elif self.path == "/admin/plan":
                self._json(srv.plan())
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            if self.path != "/v1/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with srv._lock:
                srv.received.append((dict(self.headers), body))
                srv.in_flight += 1
                srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            try:
                srv.stream(self, body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout or cancel)
            finally:
                with srv._lock:
                    srv.in_flight -= 1

    return Handler
