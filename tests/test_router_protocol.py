"""Interop test: the Rust `nitsum-router` binary with a Python worker speaking
docs/protocol.md over pyzmq + msgpack, driven by the official `openai` client.

Needs the binary (`cargo build --release`); skipped when it is missing. Set
NITSUM_ROUTER_BIN to use another build.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zmq

from nitsum.codec import to_map
from nitsum.ports import free_port
from nitsum.sampling import Sampling
from nitsum.worker.handshake import new_nonce, router_proven, worker_proof
from nitsum.worker.stats import Stats
from sealing import WorkerEnd

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("NITSUM_ROUTER_BIN", ROOT / "target" / "release" / "nitsum-router"))
EOS = 259
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def write_tiny_model(d: Path) -> None:
    """Same byte-level BPE as scheduler-rs/src/testutil.rs (id = byte value)."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab["ll"] = 256

    def special(i: int, s: str) -> dict:
        return {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }

    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            special(257, "<|endoftext|>"),
            special(258, "<|im_start|>"),
            special(EOS, "<|im_end|>"),
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": ["l l"],
        },
    }
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML})
    )
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))


SECRET = "test-worker-secret-0123456789"


class PyWorker(threading.Thread):
    """A minimal Python worker: registers (the mutual handshake: `hello`, the router's proof
    checked, `register` with ours), heartbeats, echoes the prompt one token per message."""

    def __init__(self, addr: str, worker_id: int = 0):
        super().__init__(daemon=True)
        self.addr, self.worker_id = addr, worker_id
        self.received: list[dict] = []
        self.stop = threading.Event()
        self.end = WorkerEnd()  # the handshake's frames, then the sealed channel

    def send(self, sock: zmq.Socket, **msg) -> None:
        sock.send(self.end.frame({"v": 1, "worker_id": self.worker_id, **msg}))

    def hello(self, sock: zmq.Socket, nonce: str) -> None:
        msg = {"v": 1, "worker_id": self.worker_id, "type": "hello", "handshake": 3}
        sock.send(self.end.hello(msg | {"nonce": nonce}))

    def run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, os.urandom(16).hex().encode())
        sock.connect(self.addr)
        register = dict(
            type="register",
            device="cpu",
            model="tiny",
            tp_levels=[1],
            kv_capacity_tokens=4096,
            max_context=256,
            eos_token_ids=[EOS],
        )
        nonces = [new_nonce()]  # of every hello sent: a challenge may answer an older one
        self.hello(sock, nonces[-1])
        registered, last_beat = False, 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - last_beat > 0.1:
                self.send(sock, type="heartbeat", running=0, waiting=0, free_pages=10, epoch=0)
                if not registered:
                    nonces.append(new_nonce())
                    self.hello(sock, nonces[-1])
                last_beat = now
            if not sock.poll(20):
                continue
            frame = sock.recv()
            msg = self.end.read(frame)
            self.received.append(msg)
            if msg["type"] == "challenge":
                key, theirs = SECRET.encode(), msg["nonce"]
                ours = [
                    n for n in nonces if router_proven(key, n, theirs, self.worker_id, msg["proof"])
                ]
                assert ours, "the router's proof matches none of our hellos"
                auth = worker_proof(key, ours[0], theirs, self.worker_id, "tiny")
                reg = {"v": 1, "worker_id": self.worker_id, **register, "auth": auth}
                sock.send(self.end.register(key, ours[0], frame, reg))
            elif msg["type"] == "registered":
                registered = True
                # A typed `stats`, plus a key from a newer worker the router does not know.
                stats = Stats(self.worker_id, kv_handoffs=7, num_preemptions=3)
                wire = stats.to_wire() | {"kv_cache_usage_perc": 50, "new_one": 1}
                sock.send(self.end.frame(wire))
            elif msg["type"] == "reconfigure":
                self.send(
                    sock,
                    type="reconfigured",
                    epoch=msg["epoch"],
                    ok=True,
                    error=None,
                    timings_ms={"total": 0.1},
                )
            elif msg["type"] == "generate":
                ids, s = msg["input_ids"], msg["stop"]
                out = []
                for i in range(s["max_tokens"]):
                    out.append(ids[i % len(ids)])
                    if out[-1] in s["stop_token_ids"] and not s["ignore_eos"]:
                        break
                end = "stop" if out[-1] in s["stop_token_ids"] else "length"
                for i, t in enumerate(out):
                    reason = end if i == len(out) - 1 else None
                    self.send(
                        sock,
                        type="tokens",
                        request_id=msg["request_id"],
                        token_ids=[t],
                        finish_reason=reason,
                        error=None,
                        prompt_tokens=len(ids),
                    )
        sock.close(0)


@pytest.fixture()
def router(tmp_path):
    write_tiny_model(tmp_path)
    http, zport = free_port(), free_port()
    worker_addr = f"tcp://127.0.0.1:{zport}"
    proc = subprocess.Popen(
        [
            str(BIN),
            "--listen",
            f"127.0.0.1:{http}",
            "--worker-addr",
            worker_addr,
            "--model-dir",
            str(tmp_path),
            "--served-model-name",
            "tiny",
            "--log-level",
            "warn",
        ],
        env={**os.environ, "NITSUM_WORKER_SECRET": SECRET},
    )
    worker = PyWorker(worker_addr)
    worker.start()
    import httpx

    deadline = time.monotonic() + 10
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{http}/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "router did not become healthy"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{http}", worker
    worker.stop.set()
    proc.terminate()
    proc.wait(5)


def test_openai_client_through_python_worker(router):
    import openai

    base, worker = router
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "é!"}])
    assert r.choices[0].message.content == "user\né!"
    assert r.choices[0].finish_reason == "stop"
    # <|im_start|> u s e r \n é(2 byte tokens) ! <|im_end|>
    assert r.usage.completion_tokens == 10
    stream = client.completions.create(
        model="tiny", prompt="hello world", max_tokens=8, stream=True, stop=["wo"]
    )
    text = "".join(c.choices[0].text for c in stream)
    assert text == "hello "

    gen = next(m for m in worker.received if m["type"] == "generate")
    assert set(gen) >= {
        "v",
        "type",
        "request_id",
        "input_ids",
        "resumed_tokens",
        "sampling",
        "stop",
        "output",
        "contract",
        "routing",
    }
    assert isinstance(gen["request_id"], str) and gen["contract"]["class"] == "feasible"
    assert gen["contract"]["tier"] == "strict" and gen["routing"]["decode_target"] is None
    assert gen["resumed_tokens"] == 0  # a fresh request
    # Every knob the worker declares (nitsum/sampling.py `Sampling`), no other.
    assert set(gen["sampling"]) == {f.name for f in dataclasses.fields(Sampling)}
    assert gen["output"] == {"logprobs": None, "prompt_logprobs": None}
    # Neutral unless asked: the worker skips the processors for such rows.
    neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    assert {k: gen["sampling"][k] for k in neutral} == neutral
    assert gen["sampling"]["logit_bias"] == [] and gen["stop"]["min_tokens"] == 0
    assert gen["sampling"]["min_p"] == 0.0 and gen["sampling"]["top_k"] == -1
    assert gen["sampling"]["allowed_token_ids"] == [] and gen["sampling"]["bad_words"] == []
    # Every processor the client did not ask for is at its neutral value.
    asked = {"temperature", "top_p", "top_k", "seed"}
    neutral_wire = to_map(Sampling())
    assert {k: v for k, v in gen["sampling"].items() if k not in asked} == {
        k: v for k, v in neutral_wire.items() if k not in asked
    }
    # The router adds EOS to the stop ids, once; the worker adds none.
    assert gen["stop"]["stop_token_ids"] == [EOS] and gen["stop"]["ignore_eos"] is False
    reg = next(m for m in worker.received if m["type"] == "registered")
    assert reg["worker_id"] == 0 and reg["epoch"] >= 1
    reconf = next(m for m in worker.received if m["type"] == "reconfigure")
    assert reconf["groups"] == [
        {
            "members": [0],
            "tp": 1,
            "role": "mixed",
            "tiers": ["strict", "relaxed"],
            "accepts_background": True,
        }
    ]


def test_typed_worker_stats_reach_the_metrics(router):
    import httpx

    base, _ = router
    deadline = time.monotonic() + 10
    while 'name="kv_handoffs"' not in (text := httpx.get(f"{base}/metrics").text):
        assert time.monotonic() < deadline, "no worker stats in /metrics"
        time.sleep(0.05)
    stats = [line for line in text.splitlines() if line.startswith("nitsum_worker_stat{")]
    assert sorted(stats) == [
        'nitsum_worker_stat{worker="0",name="kv_cache_usage_perc"} 50',
        'nitsum_worker_stat{worker="0",name="kv_handoffs"} 7',
        'nitsum_worker_stat{worker="0",name="num_preemptions"} 3',
    ]  # the unknown `new_one` is dropped, not exported
    assert 'vllm:num_preemptions_total{model_name="tiny"} 3' in text
    assert 'vllm:kv_cache_usage_perc{model_name="tiny"} 0.5' in text
