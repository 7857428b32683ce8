"""The router's memory levels off under huge prompts (issue 40 item 4).

`nitsum-router --mock-workers 2` gets rounds of huge prompts (320 KiB of text each, two at
once: one `/tokenize`, answered with its 320k token ids, and one chat or completion request
over the workers' 4,096-token window, tokenized and then refused with a 400, as a validation
case's 100k-token prompt was; the tokenizer's buffers for them run to tens of MiB). Before,
glibc kept what each round freed in its per-thread arenas and raised its mmap threshold after
the first huge free, so RSS climbed round after round (161 → 211 → 211 → 214 MiB here; 35 →
71 → 100 → 103 → 106 → 108 MiB over rounds of two 100k-token prompts). The router now fixes
the threshold and trims the heap after a big input (scheduler-rs/src/heap.rs): 61 MiB flat.

Bounded: 6 rounds, about 20 s on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from test_router_protocol import BIN, free_port, write_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built"),
]

ROUNDS = 6
PROMPT_BYTES = 320 * 1024  # over the router's trim threshold (256 KiB), under its 2 MiB body cap
MIB = 1 << 20


def rss(pid: int) -> int:
    """Resident set size of process `pid` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def huge_requests(round_: int) -> list[tuple[str, dict, int]]:
    """This round's two huge prompts, each with the status it gets (different text every
    round: nothing is reused)."""
    words = " ".join(f"w{round_}x{i}" for i in range(PROMPT_BYTES // 8))[:PROMPT_BYTES]
    long = (
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": words}]},
        )
        if round_ % 2
        else ("/v1/completions", {"model": "tiny", "prompt": words, "max_tokens": 2})
    )
    return [("/tokenize", {"prompt": words[::-1]}, 200), (*long, 400)]


def test_router_rss_levels_off_over_rounds_of_huge_prompts(tmp_path: Path) -> None:
    write_tiny_model(tmp_path)
    # A window that takes the whole prompt: it is tokenized, dispatched and answered.
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = 1 << 20
    (tmp_path / "config.json").write_text(json.dumps(config))
    port = free_port()
    args = [str(BIN), "--listen", f"127.0.0.1:{port}", "--worker-addr",
            f"tcp://127.0.0.1:{free_port()}", "--model-dir", str(tmp_path),
            "--served-model-name", "tiny", "--mock-workers", "2",
            "--log-level", "error"]  # fmt: skip
    proc = subprocess.Popen(args)
    levels: list[float] = []
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "router not up"
            time.sleep(0.1)
        start = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            for r in range(ROUNDS):
                reqs = huge_requests(r)
                sent = [pool.submit(http.post, path, json=body) for path, body, _ in reqs]
                for f, (path, _, status) in zip(sent, reqs, strict=True):
                    resp = f.result()
                    assert resp.status_code == status, (path, resp.text[:300])
                    if status == 400:
                        assert "maximum context length" in resp.json()["error"]["message"]
                time.sleep(0.3)  # the last streams' buffers are released
                levels.append(rss(proc.pid) / MIB)
        print("router RSS after each round (MiB):", " ".join(f"{v:.0f}" for v in levels))
        assert time.monotonic() - start < 60
    finally:
        proc.terminate()
        proc.wait(10)
    # After the first round (which grows the heap once), the level holds.
    assert max(levels[1:]) - levels[0] < 12, levels
    assert levels[-1] - levels[-2] < 2, levels
