"""A request the worker refuses reaches the client as OpenAI's 400 naming the field; a worker
failure stays a 500. Real `nitsum-router` binary, real `WorkerServer`, echo backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nitsum.errors import InvalidRequestError
from nitsum.worker.inbound import GenerateRequest
from plane import MODEL, EchoBackend, RealWorker, Router
from test_router_protocol import BIN

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]

REFUSED, BROKEN = 41, 42  # a prompt starting with one of these is refused / breaks the worker


class RefusingBackend(EchoBackend):
    """Refuses a prompt that starts with REFUSED as a bad `response_format` (as the worker's
    grammar compiler does), and fails one that starts with BROKEN as a bug would."""

    def add(self, device: int, req: GenerateRequest) -> None:
        if req.input_ids[0] == REFUSED:
            raise InvalidRequestError("response_format", "invalid JSON schema: unsupported")
        if req.input_ids[0] == BROKEN:
            raise RuntimeError("boom")
        super().add(device, req)


@pytest.fixture()
def router(tmp_path: Path) -> Iterator[Router]:
    router = Router(tmp_path)
    worker = RealWorker(router)
    worker.server.backend = RefusingBackend()
    try:
        yield router
    finally:
        worker.stop()
        router.stop()


def complete(router: Router, first: int, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "prompt": [first, 50, 51], "max_tokens": 3, "stream": stream}
    return httpx.post(f"{router.http}/v1/completions", json=body, timeout=10)


def test_a_refused_field_is_a_400_naming_it_and_a_worker_failure_a_500(router: Router) -> None:
    r = complete(router, REFUSED)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", "response_format")
    assert "invalid JSON schema" in err["message"]

    r = complete(router, BROKEN)
    assert r.status_code == 500, r.text
    assert r.json()["error"]["param"] is None and "boom" in r.json()["error"]["message"]

    # Streamed, the refusal is the stream's error event, with the same body.
    r = complete(router, REFUSED, stream=True)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["param"] == "response_format", r.text

    # The worker goes on serving.
    r = complete(router, 50)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
