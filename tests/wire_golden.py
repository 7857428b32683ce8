"""The golden router ↔ worker messages: one of each type, every field set, built from the
Python dataclasses (`generate`'s in engine/generate_message.py). tests/golden/wire/ holds them
as msgpack (and a JSON twin to read); the router's Rust types are checked against the same
files (scheduler-rs `protocols/wire_golden/`).

NOTE: every float is exact in f32 (the router's sampling and logprob fields are f32), so both
sides can compare values exactly. Regenerate deliberately: scripts/regen_wire_fixtures.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nitsum.engine import generate_message as g
from nitsum.sampling_logprobs import TokenLogprob
from nitsum.structured.spec import GrammarSpec
from nitsum.worker import protocol as proto
from nitsum.worker.bind_decision import BindDecision, BindOption
from nitsum.worker.handshake import HANDSHAKE_VERSION
from nitsum.worker.stats import Stats

GOLDEN_DIR = Path(__file__).resolve().parent / "golden" / "wire"
_STATS_NAMES = [n for n in Stats.__dataclass_fields__ if n not in ("worker_id", "last_bind")]
# Every mode and field, floats exact in f32 (scheduler-rs wire_golden/ `golden_decision`).
GOLDEN_DECISION = BindDecision(
    "prefill",
    2,
    1,
    0.25,
    (
        BindOption("dp", 185.5, 108.25, 0.125, 12.0, 0.03125),
        BindOption("prefill", 60.5, 108.25, 0.5, 24.0, 0.28125),
        BindOption("full", 58.0, 59.25, 0.75, 640.0, -4.25),
    ),
)


def worker_messages() -> dict[str, proto.Message]:
    """Worker → router, by fixture name."""
    lp = [TokenLogprob(-0.25, ((5, -0.25), (6, -1.5))), TokenLogprob(-3.0)]
    return {
        "hello": proto.Hello(3, HANDSHAKE_VERSION, "ef" * 32),
        "register": proto.Register(
            3,
            "cuda:1",
            "tiny",
            [1, 2, 4],
            2,
            65536,
            4096,
            [2, 7],
            auth="ab" * 32,
            kv_transport="tcp://10.0.0.1:29500",
        ),  # fmt: skip
        "heartbeat": proto.Heartbeat(3, running=2, waiting=5, free_pages=120, epoch=9),
        "device_lost": proto.DeviceLost(3, reason="device process exited with code -9"),
        "tokens": proto.Tokens(
            3,
            "0123456789abcdef0123456789abcdef",
            [5, 9],
            None,
            None,
            11,
            queue_ms=12.5,
            logprobs=lp,
            prompt_logprobs=[TokenLogprob(-1.5, ((4, -1.5),))],
            cached_tokens=8,
        ),  # fmt: skip
        "tokens_error": proto.Tokens(
            3,
            "fedcba9876543210fedcba9876543210",
            [],
            "error",
            "min_p: must be in [0, 1], got 2.0",
            4,
            error_param="min_p",
        ),  # fmt: skip
        # Each stat a different value, so a swap of two names shows too.
        "stats": Stats.of(
            3, {name: 100 + i for i, name in enumerate(_STATS_NAMES)}, GOLDEN_DECISION
        ),
        "reconfigured": proto.Reconfigured(
            3, 9, False, "TP 3 not in the allowed levels (1, 2, 4)", {"total": 1.5}
        ),
    }


def router_messages() -> dict[str, proto.Message]:
    """Router → worker, by fixture name."""
    groups = [
        proto.GroupPlan([0, 1, 2, 3], 2, "decode", ["gold", "silver"], False, max_batch=8, pp=2),
        proto.GroupPlan([4], 1, "prefill"),
    ]
    return {
        "challenge": proto.Challenge(3, HANDSHAKE_VERSION, "cd" * 32, "12" * 32),
        "refused": proto.Refused(3, "model 'other' is not the served model 'tiny'"),
        "registered": proto.Registered(3, epoch=9),
        "reregister": proto.Reregister(),
        "abort": proto.Abort("0123456789abcdef0123456789abcdef"),
        "reconfigure": proto.Reconfigure(9, groups),
        "flush_cache": proto.FlushCache(),
        "shutdown": proto.Shutdown(),
        "generate": generate(),
    }


def generate() -> proto.Generate:
    """`generate` with every field set, as the router sends it (Rust `Generate`)."""
    return proto.Generate(
        "0123456789abcdef0123456789abcdef",
        [1, 15, 27, 3],
        resumed_tokens=1,
        sampling=g.Sampling(
            temperature=0.5, top_p=0.75, top_k=40, seed=1234, presence_penalty=0.25,
            frequency_penalty=-0.5, repetition_penalty=1.25, logit_bias=((7, 2.5),), min_p=0.125,
            allowed_token_ids=(5, 9, 27), bad_words=((13,), (15, 27)), no_repeat_ngram_size=3,
        ),
        stop=g.Stop(max_tokens=32, min_tokens=3, stop_token_ids=(2, 13), ignore_eos=False),
        output=g.Output(logprobs=2, prompt_logprobs=1),
        contract=g.Contract(
            tier="gold", slo_class="feasible", ttft_ms=250.0, tpot_ms=40.0, weight=2.5, priority=-1,
            preempt=False, bind_tp=2,
        ),
        routing=g.Routing(
            fork_of="fedcba9876543210fedcba9876543210", decode_target=2, cache_salt="tenant-a"
        ),
        truncate_prompt_tokens=3,
        grammar=GrammarSpec("json_schema", '{"type":"object"}', replay=1),
    )  # fmt: skip


def all_wire() -> dict[str, dict[str, Any]]:
    """Every golden message as its wire map, by fixture name."""
    typed = {**worker_messages(), **router_messages()}
    return {name: msg.to_wire() for name, msg in typed.items()}


def write_all(directory: Path = GOLDEN_DIR) -> list[Path]:
    """Write `<name>.msgpack` and its `<name>.json` twin for every golden message."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, wire in sorted(all_wire().items()):
        path = directory / f"{name}.msgpack"
        path.write_bytes(proto.encode(wire))
        (directory / f"{name}.json").write_text(json.dumps(wire, indent=1) + "\n")
        written.append(path)
    return written
