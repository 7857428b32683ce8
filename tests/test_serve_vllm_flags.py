"""`nitsum serve` with the vLLM flags, end to end: one server (router + 1 CPU worker on the
embedded model) started with all of them, each flag's effect checked on real answers.

Marked slow: it starts the router and a worker. The parse-level checks are in
test_serve_flags.py.
"""

from __future__ import annotations

import re
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from serve_launch import serving

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

KEY = "k-second"
MAX_LEN = 96
# NOTE: renders only the last message's content: a prompt the model's own template (system
# prompt, role markers) could never produce, so the token count tells which one was used.
TEMPLATE = "{{ messages[-1]['content'] }}"


def gauge(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


def chat(http: httpx.Client, content: str, model: str = "a", **extra: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return http.post("/v1/chat/completions", json={"max_tokens": 4, "temperature": 0, **body})


def test_vllm_flags_each_have_their_effect(tmp_path: Path) -> None:
    template = tmp_path / "last_message.jinja"
    template.write_text(TEMPLATE)
    flags = ["--workers", "1", "--no-control", "--threads", "1"]
    flags += ["--api-key", "k-first", "--api-key", KEY, "--max-model-len", str(MAX_LEN)]
    flags += ["--served-model-name", "a", "b", "--max-num-seqs", "2"]
    flags += ["--no-enable-prefix-caching", "--chat-template", str(template)]
    with serving(tmp_path, *flags) as (base, _log):
        anon = httpx.Client(base_url=base, timeout=60)
        http = httpx.Client(base_url=base, timeout=120, headers={"authorization": f"Bearer {KEY}"})

        # --api-key (repeatable): 401 without a key or with another one; either key works.
        r = chat(anon, "Hi")
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "authentication_error"
        bad = httpx.Client(base_url=base, timeout=60, headers={"authorization": "Bearer nope"})
        assert chat(bad, "Hi").status_code == 401
        assert chat(http, "Hi").status_code == 200

        # --served-model-name a b: both listed and accepted; any other name is a 404.
        models = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["a", "b"]
        assert {m["max_model_len"] for m in models} == {MAX_LEN}  # --max-model-len
        assert chat(http, "Hi", model="b").status_code == 200
        r = chat(http, "Hi", model="c")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

        # --chat-template: the prompt is the last message's content alone.
        text = "The quick brown fox jumps over the lazy dog."
        plain = {"model": "a", "prompt": text, "add_special_tokens": False}
        ids = http.post("/tokenize", json=plain).json()["tokens"]
        assert len(ids) < 16  # the model's own template adds a system prompt and role markers
        r = chat(http, text)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)

        # --max-model-len: a prompt longer than the window is a 400 naming its field.
        r = chat(http, "word " * (MAX_LEN + 10))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] in ("messages", "max_tokens", "prompt")

        # --no-enable-prefix-caching: the same long prompt twice reuses nothing.
        long_prompt = "Tell me about " + "the sea and the sky, " * 8
        for _ in range(2):
            assert chat(http, long_prompt).status_code == 200
        time.sleep(2.5)  # a heartbeat carries the engine's counters
        assert gauge(http, "vllm:prefix_cache_hits_total") == 0

        # --max-num-seqs 2: with 6 long requests at once the engine runs at most 2.
        seen: list[float] = []

        def one(i: int) -> int:
            return chat(http, f"Count to {i + 20}.", max_tokens=48, ignore_eos=True).status_code

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(one, i) for i in range(6)]
            while not all(f.done() for f in futures):
                seen.append(gauge(http, "vllm:num_requests_running"))
                time.sleep(0.2)
            assert [f.result() for f in futures] == [200] * 6
        assert max(seen) == 2, seen


def test_tensor_parallel_size_without_control_runs_one_tp_group(tmp_path: Path) -> None:
    """`-tp 2 --no-control` on 2 devices: one host worker, one TP-2 group that answers."""
    flags = ["--workers", "2", "--no-control", "--tensor-parallel-size", "2"]
    with serving(tmp_path, *flags) as (base, log):
        http = httpx.Client(base_url=base, timeout=300)
        deadline = time.monotonic() + 60
        while True:  # the plan is sent to the host worker once both devices registered
            plan = http.get("/admin/plan").json()
            if [(g["members"], g["tp"]) for g in plan["groups"]] == [([0, 1], 2)]:
                break
            assert time.monotonic() < deadline, plan
            time.sleep(0.5)
        assert "--devices 2" in log.read_text()  # one host worker serves both devices
        r = chat(
            http, "What is the capital of France?", model="SmolLM2-135M-Instruct", max_tokens=16
        )
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["choices"][0]["message"]["content"]


def test_vllm_launch_flags_start_a_server_over_https(tmp_path: Path) -> None:
    """The accepted launch flags of serve_launch_flags.py on one real server: it serves HTTPS
    under the root path, with the engine settings they ask for on its worker."""
    from test_router_launch_flags import self_signed

    cert, key = self_signed(tmp_path)
    flags = ["--workers", "1", "--no-control", "--threads", "1", "--seed", "3"]
    flags += ["--trust-remote-code", "--disable-log-requests", "--disable-log-stats"]
    flags += ["--enable-chunked-prefill", "--max-num-batched-tokens", "256", "--enforce-eager"]
    flags += ["--block-size", "32", "--swap-space", "0.25", "--uvicorn-log-level", "info"]
    flags += ["--root-path", "/api", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    flags += ["--generation-config", "vllm", "-pp", "1", "-dp", "1", "--kv-cache-dtype", "auto"]
    with serving(tmp_path, *flags) as (base, log):
        base = base.replace("http://", "https://")
        trusting = ssl.create_default_context(cafile=str(cert))
        http = httpx.Client(base_url=base, timeout=120, verify=trusting)
        r = http.post(
            "/api/v1/chat/completions",
            json={
                "model": "SmolLM2-135M-Instruct",
                "max_tokens": 16,
                "temperature": 0,
                "request_id": "launch-flags",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            },
        )
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["choices"][0]["message"]["content"]
        text = log.read_text()
        assert "ready at https://" in text
        # The worker's command line (logged when it is started) carries the engine flags.
        for flag in ("--seed 3", "--page-tokens 32", "--token-budget 256", "--enforce-eager"):
            assert flag in text, flag
        assert "--host-kv-cache-mb 256" in text
        assert "--trust-remote-code: Nitsum runs no code" in text
        assert "launch-flags" not in text  # --disable-log-requests
