"""End to end: `nitsum serve` (Rust router + 2 CPU device workers) on the embedded
SmolLM2-135M-Instruct, driven over HTTP by the official `openai` client and by raw httpx.

One module-scoped server is shared by every test here (startup costs a model load per worker).
It runs with a router config that sets API keys, so authentication (401) and tier permissions
(403) are tested on the same server; every other request carries the all-tiers key.

Order matters: the last two tests damage the server and must stay last, in this order:
`test_kill_worker_during_concurrent_requests` kills worker 1, then `test_stalled_worker_rejoins`
SIGSTOPs worker 0 past the heartbeat timeout; the router answers its next heartbeat with
`reregister` and it rejoins.
The router config sets `heartbeat_timeout_ms` to 10 s (the default).
Every HTTP call and every wait is bounded; the server is always torn down (SIGTERM to
`nitsum serve`, then SIGKILL to its process groups and to the children it had).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from fault_load import wait_until
from nitsum.config import ModelConfig
from nitsum.kv.cache import KVCache
from nitsum.ports import free_port
from nitsum.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-e2e-all"  # every tier, default strict
BATCH_KEY = "sk-e2e-batch"  # background tier only
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
COMPLETION_PROMPT = "The capital of France is"
STARTUP_TIMEOUT_S = 240.0
HTTP_TIMEOUT_S = 60.0
HEARTBEAT_TIMEOUT_MS = 10_000


# -- the server -------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(p) for p in (task / "children").read_text().split()]
    return out


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


@dataclass
class Server:
    proc: subprocess.Popen
    base: str  # http://127.0.0.1:PORT
    log_path: Path
    children: dict[str, int] = field(default_factory=dict)  # "router", "worker0", ... -> pid
    cmdlines: dict[int, list[str]] = field(default_factory=dict)

    @property
    def v1(self) -> str:
        return f"{self.base}/v1"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies (even by SIGKILL), so no server outlives
    the run; `nitsum serve` then stops its own children."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def serve_command() -> list[str]:
    script = Path(sys.executable).parent / "nitsum"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "serve"]
    return [
        sys.executable,
        "-c",
        "import sys; from nitsum.cli import main; sys.exit(main())",
        "serve",
    ]


def find_children(server: Server, n_workers: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found: dict[str, int] = {}
        for pid in children_of(server.proc.pid):
            argv = cmdline(pid)
            server.cmdlines[pid] = argv
            if "--worker-id" in argv:
                found[f"worker{argv[argv.index('--worker-id') + 1]}"] = pid
            elif any("nitsum-router" in a or "router_main" in a for a in argv):
                found["router"] = pid
        if len(found) == n_workers + 1:
            server.children = found
            return
        time.sleep(0.2)
    raise AssertionError(f"children of nitsum serve not found: {found}\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    """SIGTERM `nitsum serve` (it stops its children), then SIGKILL whatever is left."""
    proc = server.proc
    pids = set(server.children.values()) | set(children_of(proc.pid))
    pgids = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            pgids.add(os.getpgid(pid))
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the group id is still ours
    for pgid in pgids:
        if pgid != os.getpgid(0):
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
    for pid in pids:
        argv = server.cmdlines.get(pid)
        if argv and cmdline(pid) == argv:  # still the process we started (no pid reuse)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


READY = r"nitsum serve: (\S+) ready at (\S+) \((\d+) workers\)"


def launch(
    cmd: list[str], env: dict[str, str], log_path: Path, startup_s: float
) -> tuple[Server, re.Match[str]]:
    """Start `nitsum serve` (`cmd`) in its own session, logging to `log_path`; return it and its
    `ready at` line once it prints one (stopped again when it fails to become ready)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    port = cmd[cmd.index("--port") + 1]
    srv = Server(proc=proc, base=f"http://127.0.0.1:{port}", log_path=log_path)
    deadline = time.monotonic() + startup_s
    try:
        while True:
            ready = re.search(READY, srv.log_tail(400))
            if ready:
                return srv, ready
            if proc.poll() is not None:
                raise AssertionError(f"nitsum serve exited ({proc.returncode}):\n{srv.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"nitsum serve not ready in {startup_s} s\n{srv.log_tail()}")
            time.sleep(0.25)
    except BaseException:
        stop_server(srv)
        raise


@pytest.fixture(scope="module")
def server(
    smollm2_dir: Path, nitsum_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("serve-e2e")
    config = work / "router.json"
    config.write_text(
        json.dumps(
            {
                "api_keys": [
                    {"key": KEY, "admin": True},  # /admin/plan needs an admin key
                    {"key": BATCH_KEY, "tiers": ["background"]},
                ],
                # NOTE: the worker heartbeats from its engine loop, so one long prefill step on
                # a busy 2-core machine (> 3 s, the default) gets a live worker declared dead,
                # for good (see test_stalled_worker_rejoins). 10 s keeps this suite honest
                # about the worker it really kills without flaking on load.
                "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
            }
        )
    )
    port = free_port()
    zport = free_port()
    while zport == port:
        zport = free_port()
    env = dict(os.environ, NITSUM_CACHE=str(nitsum_cache), PYTHONUNBUFFERED="1")
    cmd = [
        *serve_command(),
        "--model", str(smollm2_dir),
        "--workers", "2",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-addr", f"tcp://127.0.0.1:{zport}",
        "--config", str(config),
        # one process per worker: the kill / stall tests below target worker processes (the
        # control loop stays on, as by default: the shipped profile describes this model)
        "--no-tp-switching",
        "--kv-cache-mb", "256",
        "--startup-timeout", str(int(STARTUP_TIMEOUT_S - 10)),
        "--stop-timeout", "5",
    ]  # fmt: skip
    srv, ready = launch(cmd, env, work / "serve.log", STARTUP_TIMEOUT_S)
    try:
        assert ready.groups() == (MODEL, srv.v1, "2"), ready.group(0)
        find_children(srv, 2)
        yield srv
    finally:
        stop_server(srv)
        print(f"--- nitsum serve log (exit {srv.proc.returncode}) ---\n{srv.log_tail(200)}")


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=KEY, timeout=HTTP_TIMEOUT_S, max_retries=0)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.base,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=httpx.Timeout(HTTP_TIMEOUT_S, connect=5.0),
    ) as c:
        yield c


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


# -- helpers ----------------------------------------------------------------------------------


def metrics(http: httpx.Client) -> dict[tuple[str, frozenset], float]:
    r = http.get("/metrics", timeout=10)
    assert r.status_code == 200, r.text
    out: dict[tuple[str, frozenset], float] = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert m, f"not Prometheus text: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def msum(ms: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """Sum of the series of `name` whose labels include `labels`; fails if there is none."""
    want = set(labels.items())
    vals = [v for (n, ls), v in ms.items() if n == name and want <= ls]
    assert vals, f"no series {name}{labels} in /metrics"
    return sum(vals)


def wait_for(what: str, cond: Callable[[], Any], timeout: float, every: float = 0.25) -> Any:
    """`fault_load.wait_until`, polling every 0.25 s by default."""
    return wait_until(what, cond, timeout, every)


def assert_openai_error(
    r: httpx.Response,
    status: int,
    param: str | None = None,
    code: str | None = None,
    type_: str | None = None,
) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] == param, err
    assert err["code"] == code, err
    if type_ is not None:
        assert err["type"] == type_, err
    return err


def good_request(http: httpx.Client) -> None:
    """The server still serves: a tiny greedy completion with a known answer."""
    r = http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": COMPLETION_PROMPT, "max_tokens": 2, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == " Paris.", body
    assert body["usage"]["completion_tokens"] == 2, body


def sse_events(lines: Iterator[str], on_first: Callable[[], None] | None = None) -> list[Any]:
    """JSON payloads of `data:` lines up to `[DONE]` (the string "[DONE]" is kept last);
    `on_first` is called once, on the first chunk that carries text."""
    events: list[Any] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            events.append("[DONE]")
            break
        events.append(json.loads(data))
        if on_first and any(
            (c.get("delta") or {}).get("content") for c in events[-1].get("choices", [])
        ):
            on_first()
            on_first = None
    return events


# -- 0. the server is up ----------------------------------------------------------------------


def test_health_models_plan(
    server: Server, client: openai.OpenAI, http: httpx.Client, smollm2_dir: Path
) -> None:
    r = http.get("/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["workers"] == 2, r.text
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    hf_config = json.loads((smollm2_dir / "config.json").read_text())
    window = hf_config["max_position_embeddings"]
    # One-device workers: the context is capped by what one device's KV holds (256 MiB).
    held = KVCache.pages_in(ModelConfig.from_hf(hf_config), 256 << 20, 16, torch.float32) * 16
    assert held < window
    assert models.data[0].model_extra["max_model_len"] == held
    plan = http.get("/admin/plan", timeout=10).json()
    assert sorted(g["members"] for g in plan["groups"]) == [[0], [1]], plan
    assert sorted(w["id"] for w in plan["workers"]) == [0, 1], plan
    ms = metrics(http)
    assert msum(ms, "nitsum_workers_alive") == 2
    assert msum(ms, "nitsum_requests_inflight") == 0


# -- 1. the official openai client ------------------------------------------------------------


def test_chat_paris_nonstream_stream_and_token_counts(
    client: openai.OpenAI, http: httpx.Client, tok: Tokenizer
) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=32, temperature=0
    )
    text = reply.choices[0].message.content
    assert "Paris" in text, text
    assert reply.choices[0].finish_reason == "stop", reply
    assert reply.choices[0].message.role == "assistant"
    assert reply.model == MODEL and reply.object == "chat.completion"

    # prompt tokens: the chat template rendered with add_generation_prompt, no extra specials
    prompt_ids = tok.encode(tok.apply_chat_template(PARIS, add_generation_prompt=True))
    assert reply.usage.prompt_tokens == len(prompt_ids)
    # completion tokens: the same greedy request on the native endpoint returns the token ids
    r = http.post(
        "/generate",
        json={"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 32, "temperature": 0}},
    )
    assert r.status_code == 200, r.text
    gen = r.json()
    assert (
        reply.usage.completion_tokens
        == len(gen["output_ids"])
        == gen["meta_info"]["completion_tokens"]
    )
    assert gen["meta_info"]["prompt_tokens"] == reply.usage.prompt_tokens
    assert gen["meta_info"]["finish_reason"]["type"] == "stop"
    assert tok.decode(gen["output_ids"]) == text == gen["text"]
    assert gen["output_ids"][-1] in tok.eos_token_ids, gen  # stopped on EOS, counted in usage
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

    # streamed: same text, same usage
    stream = client.chat.completions.create(
        model=MODEL,
        messages=PARIS,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert "".join(pieces) == text
    assert [f for f in finishes if f] == ["stop"] and finishes[-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    # The same counts; only how much of the prompt was cached may differ (the second request
    # reuses the first's prefix when it lands on the same worker).
    streamed, whole = chunks[-1].usage.model_dump(), reply.usage.model_dump()
    cached = streamed.pop("prompt_tokens_details")["cached_tokens"]
    whole.pop("prompt_tokens_details")
    assert streamed == whole
    assert 0 <= cached < whole["prompt_tokens"], cached
    assert len({c.id for c in chunks}) == 1


def test_completions_nonstream_stream_token_ids_and_stop(
    client: openai.OpenAI, http: httpx.Client, tok: Tokenizer
) -> None:
    reply = client.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=8, temperature=0
    )
    text = reply.choices[0].text
    assert text.startswith(" Paris"), text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 8
    prompt_ids = tok.encode(COMPLETION_PROMPT)
    assert reply.usage.prompt_tokens == len(prompt_ids)

    r = http.post(
        "/generate",
        json={
            "text": COMPLETION_PROMPT,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        },
    )
    assert r.status_code == 200, r.text
    gen = r.json()
    assert len(gen["output_ids"]) == reply.usage.completion_tokens
    assert gen["text"] == text == tok.decode(gen["output_ids"])
    assert gen["meta_info"]["finish_reason"]["type"] == "length"

    # a token-id prompt gives the same answer
    by_ids = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == text
    assert by_ids.usage.model_dump() == reply.usage.model_dump()

    # streamed
    stream = client.completions.create(
        model=MODEL,
        prompt=COMPLETION_PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == reply.usage.model_dump()

    # stop string: output cut right before it, finish_reason stop
    stopped = client.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=8, temperature=0, stop=["."]
    )
    assert stopped.choices[0].text == text.split(".")[0] == " Paris"
    assert stopped.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=MODEL,
        prompt=COMPLETION_PROMPT,
        max_tokens=8,
        temperature=0,
        stop=["."],
        stream=True,
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == " Paris"


def test_request_variants(client: openai.OpenAI) -> None:
    """Text parts, max_completion_tokens, a stop list, a batch of one prompt: same answers."""
    base = client.chat.completions.create(model=MODEL, messages=PARIS, max_tokens=32, temperature=0)
    parts = [{"role": "user", "content": [{"type": "text", "text": PARIS[0]["content"]}]}]
    by_parts = client.chat.completions.create(
        model=MODEL, messages=parts, max_completion_tokens=32, temperature=0
    )
    assert by_parts.choices[0].message.content == base.choices[0].message.content
    assert by_parts.usage.model_dump() == base.usage.model_dump()
    capped = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_completion_tokens=3, temperature=0
    )
    assert capped.usage.completion_tokens == 3 and capped.choices[0].finish_reason == "length"
    assert base.choices[0].message.content.startswith(capped.choices[0].message.content)
    stopped = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=32, temperature=0, stop=["xyz", " is"]
    )
    assert stopped.choices[0].message.content == base.choices[0].message.content.split(" is")[0]
    assert stopped.choices[0].finish_reason == "stop"
    one = client.completions.create(
        model=MODEL, prompt=[COMPLETION_PROMPT], max_tokens=2, temperature=0
    )
    assert one.choices[0].text == " Paris."


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> tuple[str, int]:
        r = client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=12,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        return r.choices[0].text, r.usage.completion_tokens

    # four requests of one prompt: the same tokens wherever they run (prefix affinity keeps
    # a repeated prompt on its worker while that one is not much busier)
    first = sample(1234)
    assert first[1] == 12
    assert [sample(1234) for _ in range(3)] == [first] * 3


# -- 2. bad input: OpenAI-shaped 4xx, and the server keeps serving ---------------------------

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]

BAD_REQUESTS = [
    # id, path, raw body or JSON, extra headers, status, param, code, type
    (
        "malformed_json",
        CHAT,
        b'{"model": "SmolLM2-135M-Instruct", "messages": [',
        {},
        400,
        None,
        "invalid_json",
        "invalid_request_error",
    ),
    (
        "missing_messages",
        CHAT,
        {"model": MODEL, "max_tokens": 2},
        {},
        400,
        "messages",
        None,
        "invalid_request_error",
    ),
    (
        "missing_prompt",
        "/v1/completions",
        {"model": MODEL, "max_tokens": 2},
        {},
        400,
        "prompt",
        None,
        "invalid_request_error",
    ),
    (
        "misspelt_field",
        CHAT,
        {"model": MODEL, "messages": HI, "max_token": 2},
        {},
        400,
        "max_token",
        None,
        "invalid_request_error",
    ),
    (
        "unknown_model",
        CHAT,
        {"model": "gpt-4o", "messages": HI},
        {},
        404,
        "model",
        "model_not_found",
        "invalid_request_error",
    ),
    (
        "chat_over_context",
        CHAT,
        {
            "model": MODEL,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello " * 9000}],
        },
        {},
        400,
        "messages",
        None,
        "invalid_request_error",
    ),
    # exactly the window: no room left for one output token
    (
        "ids_fill_context",
        "/v1/completions",
        {"model": MODEL, "prompt": [42] * 8192, "max_tokens": 1},
        {},
        400,
        "prompt",
        None,
        "invalid_request_error",
    ),
    (
        "max_tokens_0",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 0},
        {},
        400,
        "max_tokens",
        None,
        "invalid_request_error",
    ),
    (
        "n_17",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 2, "n": 17},
        {},
        400,
        "n",
        None,
        "invalid_request_error",
    ),
    (
        "unknown_tier",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 2},
        {"x-nitsum-tier": "platinum"},
        400,
        "tier",
        None,
        "invalid_request_error",
    ),
    (
        "token_id_out_of_vocab",
        "/v1/completions",
        {"model": MODEL, "prompt": [1, 2, 49152], "max_tokens": 1},  # the vocabulary is 0..49151
        {},
        400,
        "prompt",
        None,
        "invalid_request_error",
    ),
    (
        "batch_with_an_empty_prompt",
        "/v1/completions",
        {"model": MODEL, "prompt": ["a", ""], "max_tokens": 1},
        {},
        400,
        "prompt",
        None,
        "invalid_request_error",
    ),
    (
        "empty_prompt",
        "/v1/completions",
        {"model": MODEL, "prompt": "", "max_tokens": 1},
        {},
        400,
        "prompt",
        None,
        "invalid_request_error",
    ),
    (
        "empty_messages",
        CHAT,
        {"model": MODEL, "messages": [], "max_tokens": 1},
        {},
        400,
        "messages",
        None,
        "invalid_request_error",
    ),
    (
        "temperature_negative",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 1, "temperature": -0.5},
        {},
        400,
        "temperature",
        None,
        "invalid_request_error",
    ),
    (
        "top_p_zero",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 1, "top_p": 0},
        {},
        400,
        "top_p",
        None,
        "invalid_request_error",
    ),
    (
        "wrong_field_type",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": "two"},
        {},
        400,
        "max_tokens",
        "invalid_json",
        "invalid_request_error",
    ),
    (
        "missing_key",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 2},
        {"authorization": None},
        401,
        None,
        "invalid_api_key",
        "authentication_error",
    ),
    (
        "wrong_key",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 2},
        {"authorization": "Bearer sk-nope"},
        401,
        None,
        "invalid_api_key",
        "authentication_error",
    ),
    (
        "forbidden_tier",
        CHAT,
        {"model": MODEL, "messages": HI, "max_tokens": 2},
        {"authorization": f"Bearer {BATCH_KEY}", "x-nitsum-tier": "strict"},
        403,
        "tier",
        None,
        "permission_error",
    ),
]


@pytest.mark.parametrize(
    "path,body,headers,status,param,code,type_",
    [b[1:] for b in BAD_REQUESTS],
    ids=[b[0] for b in BAD_REQUESTS],
)
def test_bad_request_is_openai_error_and_server_keeps_serving(
    http: httpx.Client,
    path: str,
    body: Any,
    headers: dict,
    status: int,
    param: str | None,
    code: str | None,
    type_: str,
) -> None:
    hdrs = dict(http.headers)
    hdrs["content-type"] = "application/json"
    for k, v in headers.items():
        if v is None:
            hdrs.pop(k, None)
        else:
            hdrs[k] = v
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as bare:  # no default auth header
        r = bare.post(http.base_url.join(path), content=content, headers=hdrs)
    assert_openai_error(r, status, param=param, code=code, type_=type_)
    good_request(http)


def test_openai_client_raises_typed_errors(
    server: Server, client: openai.OpenAI, http: httpx.Client
) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=HI, max_tokens=2)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, n=17)
    assert e.value.param == "n"
    bad_key = openai.OpenAI(base_url=server.v1, api_key="sk-nope", timeout=30, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad_key.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert e.value.code == "invalid_api_key"
    batch = openai.OpenAI(base_url=server.v1, api_key=BATCH_KEY, timeout=60, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        batch.completions.create(
            model=MODEL, prompt="Hi", max_tokens=2, extra_headers={"x-nitsum-tier": "strict"}
        )
    # the background key without a tier header: its default (background) tier is served
    before = msum(
        metrics(http),
        "nitsum_requests_dispatched_total",
        tier="background",
        **{"class": "background"},
    )
    ok = batch.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=2, temperature=0
    )
    assert ok.choices[0].text == " Paris."
    after = msum(
        metrics(http),
        "nitsum_requests_dispatched_total",
        tier="background",
        **{"class": "background"},
    )
    assert after == before + 1
    good_request(http)


# -- 3. a client that disconnects mid-request -------------------------------------------------

# ~4000 decode steps: minutes on these CPUs, so only an abort ends it within the bounds below
LONG = {
    "model": MODEL,
    "prompt": "Once upon a time",
    "max_tokens": 4000,
    "temperature": 0,
    "ignore_eos": True,
}


def _running_one(http: httpx.Client) -> bool:
    """The request is in flight and a worker reports it running (heartbeats every 500 ms)."""
    m = metrics(http)
    return msum(m, "nitsum_requests_inflight") == 1 and msum(m, "nitsum_group_running") == 1


def _wait_released(http: httpx.Client, cancelled: float) -> float:
    """Wait until the router and the workers hold nothing and `cancelled` requests were
    cancelled in total; the seconds it took."""
    t0 = time.monotonic()

    def released() -> bool:
        m = metrics(http)
        return (
            msum(m, "nitsum_requests_inflight") == 0
            and msum(m, "nitsum_group_running") == 0
            and msum(m, "nitsum_group_waiting") == 0
            and msum(m, "nitsum_group_assigned") == 0
            and msum(m, "nitsum_requests_cancelled_total") == cancelled
        )

    wait_for("the worker to drop the aborted request", released, timeout=15)
    return time.monotonic() - t0


def test_client_disconnect_mid_stream_aborts_on_worker(http: httpx.Client) -> None:
    ms = metrics(http)
    assert msum(ms, "nitsum_requests_inflight") == 0
    cancelled0 = msum(ms, "nitsum_requests_cancelled_total")
    finished0 = msum(ms, "nitsum_requests_finished_total")
    with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        while got < 2:  # two chunks
            line = next(lines)
            if line.startswith("data:"):
                assert json.loads(line[5:])["choices"][0]["text"] is not None
                got += 1
        wait_for("the request to show as running", lambda: _running_one(http), timeout=10)
        r.close()  # disconnect
    took = _wait_released(http, cancelled0 + 1)
    print(f"stream: abort observed {took:.2f} s after the disconnect")
    assert msum(metrics(http), "nitsum_requests_finished_total") == finished0
    good_request(http)


def test_client_timeout_non_stream_aborts_on_worker(server: Server, http: httpx.Client) -> None:
    cancelled0 = msum(metrics(http), "nitsum_requests_cancelled_total")
    seen_running: list[bool] = []

    def watch() -> None:
        with contextlib.suppress(AssertionError):
            seen_running.append(wait_for("running", lambda: _running_one(http), timeout=10))

    watcher = ThreadPoolExecutor(max_workers=1)
    watching = watcher.submit(watch)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up: its socket is closed
        http.post("/v1/completions", json=LONG, timeout=httpx.Timeout(4.0, connect=5.0))
    watching.result(timeout=15)
    watcher.shutdown()
    assert seen_running == [True], "the request never showed as running"
    took = _wait_released(http, cancelled0 + 1)
    print(f"non-stream: abort observed {took:.2f} s after the client timed out")
    good_request(http)


# -- 4. a worker dies under load (LAST: it kills worker 1) ------------------------------------


def _count_request(i: int, stream: bool) -> dict[str, Any]:
    """Request `i` of the kill test: greedy, 24 tokens whatever they are."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def _one_request(
    http: httpx.Client, i: int, out: dict[int, tuple[str, str]], streaming: list[int]
) -> None:
    """Send request `i` (odd ones stream) and record ("ok", its text), ("error", why) or
    ("bad", what went wrong) in `out[i]`."""
    stream = i % 2 == 1
    body = _count_request(i, stream)
    try:
        if not stream:
            r = http.post(CHAT, json=body, timeout=httpx.Timeout(90.0, connect=5.0))
            if r.status_code == 200:
                b = r.json()
                ok = (
                    b["usage"]["completion_tokens"] == 24
                    and b["choices"][0]["finish_reason"] == "length"
                )
                out[i] = ("ok", b["choices"][0]["message"]["content"]) if ok else ("bad", r.text)
            elif r.status_code >= 500:
                err = assert_openai_error(
                    r,
                    r.status_code,
                    param=r.json()["error"]["param"],
                    code=r.json()["error"]["code"],
                )
                out[i] = ("error", f"{r.status_code} {err['message']}")
            else:
                out[i] = ("bad", f"{r.status_code} {r.text}")
            return
        with http.stream("POST", CHAT, json=body, timeout=httpx.Timeout(90.0, connect=5.0)) as r:
            if r.status_code != 200:
                r.read()
                kind = "error" if r.status_code >= 500 else "bad"
                out[i] = (kind, f"{r.status_code} {r.text}")
                return
            events = sse_events(r.iter_lines(), lambda: streaming.append(i))
        if not events or events[-1] != "[DONE]":
            out[i] = ("bad", f"stream without [DONE]: {events[-2:]}")
        elif any("error" in e for e in events[:-1]):
            err = next(e for e in events[:-1] if "error" in e)["error"]
            assert {"message", "type", "param", "code"} <= set(err)
            out[i] = ("error", f"stream: {err['message']}")
        elif [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]][
            -1
        ] == "length":
            text = "".join(
                c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c["choices"]
            )
            out[i] = ("ok", text)
        else:
            out[i] = ("bad", f"stream ended oddly: {events[-3:]}")
    except Exception as e:  # timeouts, resets: a failure of the test, recorded per request
        out[i] = ("bad", f"{type(e).__name__}: {e}")


def test_kill_worker_during_concurrent_requests(
    server: Server, http: httpx.Client, client: openai.OpenAI
) -> None:
    n = 50
    victim = server.children["worker1"]
    assert (
        "--worker-id" in cmdline(victim)
        and cmdline(victim)[cmdline(victim).index("--worker-id") + 1] == "1"
    )
    ms0 = metrics(http)

    def deaths_logged() -> int:
        return server.log_path.read_text(errors="replace").count("workers missed their heartbeats")

    deaths_before = deaths_logged()
    out: dict[int, tuple[str, str]] = {}
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    t0 = time.monotonic()
    pool_http = httpx.Client(
        base_url=server.base,
        headers={"authorization": f"Bearer {KEY}"},
        limits=limits,
        timeout=httpx.Timeout(90.0, connect=5.0),
    )
    pool = ThreadPoolExecutor(max_workers=n)
    not_done: set = set()
    try:
        streaming: list[int] = []  # streams that got their first token
        futures = [pool.submit(_one_request, pool_http, i, out, streaming) for i in range(n)]
        # kill worker 1 while it is generating: some streams are mid-way (those on worker 1
        # resume on worker 0 from their tokens), others still queued or prefilling (retried)
        wait_for(
            "worker 1 to run requests while a few streams have tokens",
            lambda: (
                len(streaming) >= 4 and msum(metrics(http), "nitsum_group_running", group="1") > 0
            ),
            timeout=30,
            every=0.05,
        )
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic() - t0
        streaming_at_kill = len(streaming)
        done, not_done = wait(futures, timeout=120)
        for f in done:
            f.result()
    finally:
        if not_done:  # closing the sockets makes the stuck threads return
            pool_http.close()
        pool.shutdown(wait=not not_done, cancel_futures=True)
        pool_http.close()
    elapsed = time.monotonic() - t0
    kinds = [out.get(i, ("bad", "no outcome"))[0] for i in range(n)]
    summary = {k: kinds.count(k) for k in ("ok", "error", "bad")}
    print(f"killed worker 1 at {killed_at:.1f} s; all {n} ended after {elapsed:.1f} s: {summary}")
    print(f"streams with tokens at the kill: {streaming_at_kill}")
    for i in range(n):
        if out.get(i, ("bad",))[0] != "ok":
            print(i, out.get(i))
    assert not not_done, f"{len(not_done)} requests still pending after 120 s"
    assert summary["bad"] == 0, [out.get(i) for i in range(n) if kinds[i] == "bad"]
    # NOTE: a request the dead worker held is re-dispatched to the survivor; one that had
    # streamed resumes from its tokens. None may end with an error while a worker lives.
    assert summary["error"] == 0, [out.get(i) for i in range(n) if kinds[i] == "error"]

    # the router noticed (its log; /health may already count the restarted worker again);
    # the dead worker's requests were retried or ended with an error (it was running some)
    wait_for(
        "the router to declare worker 1 dead",
        lambda: deaths_logged() > deaths_before,
        timeout=15,
    )
    ms1 = metrics(http)
    retried = msum(ms1, "nitsum_requests_retried_total") - msum(
        ms0, "nitsum_requests_retried_total"
    )
    errors = msum(ms1, "nitsum_requests_error_total") - msum(ms0, "nitsum_requests_error_total")
    rejected = msum(ms1, "nitsum_requests_rejected_total") - msum(
        ms0, "nitsum_requests_rejected_total"
    )
    resumed = msum(ms1, "nitsum_requests_resumed_total") - msum(
        ms0, "nitsum_requests_resumed_total"
    )
    print(f"router: retried {retried:.0f} (resumed {resumed:.0f}), errors {errors:.0f}")
    assert retried >= 1 and resumed >= 1, (retried, resumed)
    assert errors == 0 and rejected == 0, (errors, rejected)
    assert msum(ms1, "nitsum_requests_inflight") == 0
    assert server.proc.poll() is None, "nitsum serve exited after a worker died"

    # no token lost or repeated: every text (resumed ones included) is the greedy answer
    # the survivor gives to the same request uninterrupted
    def reference(i: int) -> str:
        r = http.post(CHAT, json=_count_request(i, False), timeout=90)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=8) as refs:
        expected = list(refs.map(reference, range(n)))
    differ = [(i, out[i][1], expected[i]) for i in range(n) if out[i][1] != expected[i]]
    assert not differ, differ

    # the survivor serves new requests
    reply = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=32, temperature=0
    )
    assert "Paris" in reply.choices[0].message.content
    good_request(http)

    # `nitsum serve` restarts the killed worker (backoff 1 s), which registers again
    wait_for(
        "the killed worker to be restarted and rejoin",
        lambda: http.get("/health", timeout=10).json().get("workers") == 2,
        timeout=STARTUP_TIMEOUT_S,
    )
    log_text = server.log_path.read_text(errors="replace")
    assert "worker1 exited with code -9" in log_text and "restarting in 1 s" in log_text

    def planned_devices() -> list[int]:
        groups = http.get("/admin/plan", timeout=10).json()["groups"]
        return sorted(m for g in groups for m in g["members"])

    wait_for("worker 1 back in the plan", lambda: planned_devices() == [0, 1], timeout=30)
    good_request(http)


# -- 5. a worker that stalls past the heartbeat timeout comes back (LAST: uses worker 0) -------


def test_stalled_worker_rejoins(server: Server, http: httpx.Client) -> None:
    """A worker silent for longer than the heartbeat timeout (here SIGSTOP, in real life one
    long engine step on a busy CPU) is declared dead; once it runs again it must rejoin."""
    worker0 = server.children["worker0"]
    assert os.path.exists(f"/proc/{worker0}")
    before = http.get("/health", timeout=10).json()["workers"]
    assert before >= 1
    os.kill(worker0, signal.SIGSTOP)
    try:
        wait_for(
            "worker 0 to be declared dead",
            lambda: http.get("/health", timeout=10).json().get("workers") == before - 1,
            timeout=HEARTBEAT_TIMEOUT_MS / 1000 + 10,
        )
    finally:
        os.kill(worker0, signal.SIGCONT)
    # heartbeats every 500 ms, re-register every 5 s: 15 s is plenty
    wait_for(
        "worker 0 to rejoin",
        lambda: http.get("/health", timeout=10).json().get("workers") == before,
        timeout=15,
    )
    good_request(http)
