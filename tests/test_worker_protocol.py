"""The v1 message codec: framing, the message dataclasses and `generate` validation."""

from __future__ import annotations

import re

import msgpack
import pytest

from nitsum.sampling import SamplingParams
from nitsum.sampling_logprobs import TokenLogprob
from nitsum.worker import handshake, inbound
from nitsum.worker import protocol as proto
from nitsum.worker.protocol import ProtocolError
from nitsum.worker.stats import Stats


def roundtrip(msg):
    return proto.decode(proto.encode(msg))


def test_decode_refuses_what_it_cannot_act_on():
    with pytest.raises(ProtocolError, match="not msgpack"):
        proto.decode(b"\xc1")
    with pytest.raises(ProtocolError, match="expected a map, got list"):
        proto.decode(msgpack.packb([1, "generate"]))
    with pytest.raises(ProtocolError, match="version 2 refused"):
        proto.decode(msgpack.packb({"v": 2, "type": "generate"}))
    with pytest.raises(ProtocolError, match="'type'"):
        proto.decode(msgpack.packb({"v": 1}))
    # Unknown keys are kept (and ignored by the worker): forward compatible.
    assert roundtrip({"v": 1, "type": "abort", "request_id": "a", "new": {"x": 1}})["new"] == {
        "x": 1
    }


def test_worker_messages_carry_the_documented_fields():
    t = roundtrip(proto.Tokens(3, "r", [5, 6], None, None, prompt_tokens=4).to_wire())
    assert t == {
        "v": 1,
        "type": "tokens",
        "worker_id": 3,
        "request_id": "r",
        "token_ids": [5, 6],
        "finish_reason": None,
        "error": None,
        "prompt_tokens": 4,
    }
    # A request's first tokens may carry its queue time; absent otherwise (backward compatible).
    first = proto.Tokens(3, "r", [5], None, None, prompt_tokens=4, queue_ms=12.5).to_wire()
    assert roundtrip(first)["queue_ms"] == 12.5 and "queue_ms" not in t
    hb = roundtrip(proto.Heartbeat(1, running=2, waiting=3, free_pages=4, epoch=5).to_wire())
    assert [hb[k] for k in ("running", "waiting", "free_pages", "epoch")] == [2, 3, 4, 5]
    reg = roundtrip(proto.Register(0, "cpu", "m", [1], 0, 640, 2048, [2]).to_wire())
    assert set(reg) == {
        "v", "type", "worker_id", "device", "model", "tp_levels", "kv_capacity_tokens",
        "max_context", "eos_token_ids", "domain",
    }  # fmt: skip
    assert proto.Register.from_wire(reg) == proto.Register(0, "cpu", "m", [1], 0, 640, 2048, [2])
    stats = roundtrip(Stats.of(3, {"kv_handoffs": 2, "kv_handoff_bytes": 4096}).to_wire())
    assert stats == {"v": proto.PROTOCOL_VERSION, "type": "stats", "worker_id": 3,
                     "kv_handoffs": 2, "kv_handoff_bytes": 4096}  # fmt: skip
    with pytest.raises(ValueError, match="no field for counters \\['kv_handofs'\\]"):
        Stats.of(3, {"kv_handofs": 2})
    with pytest.raises(AssertionError):
        proto.Tokens(0, "r", [], "done", None, 1)  # type: ignore[arg-type]


def test_from_wire_names_the_bad_field():
    tokens = proto.Tokens(3, "r", [5], "stop", None, 1).to_wire()
    assert proto.Tokens.from_wire(tokens) == proto.Tokens(3, "r", [5], "stop", None, 1)
    for change, message in [
        ({"token_ids": [5, "6"]}, "tokens: token_ids[1] must be an integer, got '6'"),
        ({"finish_reason": "done"}, "tokens: finish_reason must be one of ('stop', "),
        ({"prompt_tokens": True}, "tokens: prompt_tokens must be an integer, got True"),
        ({"logprobs": [{"logprob": -1.0, "top": [[5]]}]}, "tokens: logprobs[0].top[0] must"),
        ({"request_id": None}, "tokens: request_id must be a string, got None"),
    ]:
        with pytest.raises(ProtocolError) as e:
            proto.Tokens.from_wire({**tokens, **change})
        assert str(e.value).startswith(message), e.value
    with pytest.raises(ProtocolError, match="tokens: worker_id is missing"):
        proto.Tokens.from_wire({k: v for k, v in tokens.items() if k != "worker_id"})
    with pytest.raises(ProtocolError, match="expected a 'abort' message, got 'tokens'"):
        proto.Abort.from_wire(tokens)
    with pytest.raises(ProtocolError, match="abort: request_id must be a non-empty string"):
        proto.Abort.from_wire({"v": 1, "type": "abort", "request_id": ""})


def _with(msg: dict, part: str, **values) -> dict:
    """`msg` with keys of its nested `part` map changed."""
    return {**msg, part: {**msg[part], **values}}


def test_parse_generate_round_trips_sampling():
    params = SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=4, seed=11,
                            stop_token_ids=(3, 4), ignore_eos=True)  # fmt: skip
    msg = roundtrip(proto.generate("r1", [1, 2], params, tier="gold", slo_class="background"))
    assert msg["contract"]["class"] == "background" and msg["stop"]["max_tokens"] == 7
    req = inbound.parse_generate(msg)
    assert (req.request_id, req.input_ids, req.spec.tier, req.spec.slo_class) == (
        "r1",
        [1, 2],
        "gold",
        "background",
    )
    assert (
        req.spec.sampling == params and req.spec.decode_target is None and req.spec.ttft_ms is None
    )
    assert inbound.parse_generate(_with(msg, "contract", ttft_ms=250)).spec.ttft_ms == 250.0
    assert (req.spec.priority, req.spec.may_preempt) == (0, True)
    got = inbound.parse_generate(_with(msg, "contract", priority=-4, preempt=False))
    assert (got.spec.priority, got.spec.may_preempt) == (-4, False)
    assert req.spec.bind_tp is None
    assert inbound.parse_generate(_with(msg, "contract", bind_tp=2)).spec.bind_tp == 2
    assert inbound.parse_generate(_with(msg, "routing", decode_target=5)).spec.decode_target == 5
    # Integer temperature from a loose encoder is accepted as a float; absent parts default.
    loose = {**msg, "sampling": {"temperature": 0}, "stop": {"max_tokens": 2}}
    assert inbound.parse_generate(loose).spec.sampling == SamplingParams(
        max_tokens=2, temperature=0.0
    )


def test_sampling_processors_logprobs_and_fork_of_cross_the_wire():
    params = SamplingParams(max_tokens=9, presence_penalty=0.5, frequency_penalty=-1.0,
                            repetition_penalty=1.25, logit_bias=((7, 100.0), (3, -2.5)),
                            min_tokens=2, min_p=0.05, logprobs=4)  # fmt: skip
    msg = roundtrip(proto.generate("r1", [1, 2], params))
    assert msg["sampling"]["logit_bias"] == [[7, 100.0], [3, -2.5]]
    assert (msg["stop"]["min_tokens"], msg["output"]["logprobs"]) == (2, 4)
    req = inbound.parse_generate(msg)
    assert req.spec.sampling == params and req.spec.fork_of is None
    assert inbound.parse_generate(_with(msg, "routing", fork_of="r0")).spec.fork_of == "r0"
    # Integer values from a loose encoder (the router's f32 as msgpack ints) are floats here.
    loose = inbound.parse_generate({**msg, "sampling": {"logit_bias": [[7, 100]], "min_p": 0}})
    assert loose.spec.sampling.logit_bias == ((7, 100.0),) and loose.spec.sampling.min_p == 0.0
    lp = [TokenLogprob(-0.25, ((5, -0.25), (6, -1.5))), TokenLogprob(-3.0)]
    tokens = roundtrip(proto.Tokens(0, "r1", [5, 9], None, None, 2, logprobs=lp).to_wire())
    assert tokens["logprobs"] == [
        {"logprob": -0.25, "top": [[5, -0.25], [6, -1.5]]},
        {"logprob": -3.0, "top": []},
    ]
    assert proto.Tokens.from_wire(tokens).logprobs == lp
    assert "logprobs" not in proto.Tokens(0, "r1", [5], None, None, 2).to_wire()  # not asked


@pytest.mark.parametrize(
    ("part", "change", "field"),
    [
        (None, {"input_ids": "1 2"}, "input_ids"),
        (None, {"input_ids": [1, True]}, "input_ids[1]"),
        (None, {"sampling": None}, "sampling"),
        (None, {"resumed_tokens": "1"}, "resumed_tokens"),
        ("stop", {"max_tokens": "3"}, "stop.max_tokens"),
        ("sampling", {"temperature": None}, "sampling.temperature"),
        ("sampling", {"seed": 1.5}, "sampling.seed"),
        ("stop", {"stop_token_ids": [1, "x"]}, "stop.stop_token_ids[1]"),
        ("stop", {"ignore_eos": 1}, "stop.ignore_eos"),
        ("contract", {"class": "vip"}, "contract.class"),
        ("contract", {"tier": 3}, "contract.tier"),
        ("routing", {"decode_target": "2"}, "routing.decode_target"),
        ("contract", {"ttft_ms": "100"}, "contract.ttft_ms"),
        ("contract", {"priority": 1.5}, "contract.priority"),
        ("contract", {"preempt": 1}, "contract.preempt"),
        ("contract", {"bind_tp": "2"}, "contract.bind_tp"),
        ("sampling", {"logit_bias": {"5": 1.0}}, "sampling.logit_bias"),
        ("sampling", {"logit_bias": [[5]]}, "sampling.logit_bias[0]"),
        ("stop", {"min_tokens": 1.0}, "stop.min_tokens"),
        ("sampling", {"min_p": "0.1"}, "sampling.min_p"),
        ("output", {"logprobs": True}, "output.logprobs"),
        ("sampling", {"presence_penalty": None}, "sampling.presence_penalty"),
        ("routing", {"fork_of": 3}, "routing.fork_of"),
    ],
)
def test_parse_generate_names_the_bad_field(part, change, field):
    """A malformed `generate` is the codec's ProtocolError naming the field (no value range
    is checked here: the router checked them)."""
    msg = proto.generate("r", [1], SamplingParams())
    msg = {**msg, **change} if part is None else _with(msg, part, **change)
    with pytest.raises(ProtocolError) as e:
        inbound.parse_generate(msg)
    assert str(e.value).startswith(f"generate: {field} must be "), e.value


def test_generate_without_request_id_cannot_be_answered():
    msg = proto.generate("", [1], SamplingParams())
    with pytest.raises(ProtocolError, match="request_id"):
        inbound.parse_generate(msg)


def test_reconfigure_from_wire():
    g = proto.GroupPlan([0, 1], 2, "prefill", ["a"], False)
    msg = roundtrip(proto.Reconfigure(4, [g]).to_wire())
    assert "pp" not in msg["groups"][0] and "max_batch" not in msg["groups"][0]  # defaults
    assert proto.Reconfigure.from_wire(msg) == proto.Reconfigure(4, [g])
    raw = msg["groups"][0]
    for bad, where in [
        ({**raw, "members": []}, "groups[0].members"),
        ({**raw, "tp": 0}, "groups[0].tp"),
        ({**raw, "role": "boss"}, "groups[0].role"),
        ({**raw, "tiers": "a"}, "groups[0].tiers"),
        ({**raw, "max_batch": 0}, "groups[0].max_batch"),
        ({**raw, "pp": 0}, "groups[0].pp"),
    ]:
        with pytest.raises(ProtocolError, match=f"^reconfigure: {re.escape(where)} must be"):
            proto.Reconfigure.from_wire({**msg, "groups": [bad]})
    with pytest.raises(ProtocolError, match="epoch"):
        proto.Reconfigure.from_wire({"v": 1, "type": "reconfigure", "groups": []})


def test_handshake_proofs_match_the_router():
    # Same vectors as scheduler-rs/src/worker_auth/mod.rs (proofs_match_known_vectors).
    key, ours, theirs = b"nitsum-test-secret-0001", "ab" * 32, "cd" * 32
    router = "f4f77be8f6514f3a2f624bbee5db92b568ad5f0517369f85321b1d18ca245db8"
    worker = "e26dc0e8e309d10a1db7e74eb7774853d021734b33642178f1d4e2d488e03f15"
    assert handshake.router_proof(key, ours, theirs, 7) == router
    assert handshake.worker_proof(key, ours, theirs, 7, "tiny") == worker
    assert handshake.router_proven(key, ours, theirs, 7, router)
    assert handshake.router_proven(key, ours, theirs, 7, router.upper())
    # Another worker nonce (a relay's own hello), id, secret, or the worker's own proof: no.
    assert not handshake.router_proven(key, "ef" * 32, theirs, 7, router)
    assert not handshake.router_proven(key, ours, theirs, 8, router)
    assert not handshake.router_proven(b"another-secret-0000000", ours, theirs, 7, router)
    assert not handshake.router_proven(key, ours, theirs, 7, worker)
    for bad in ("", "zz" * 32, router[:-2], "\u00e9" * 64):
        assert not handshake.router_proven(key, ours, theirs, 7, bad)
    for bad_nonce in ("zz" * 32, "ab" * 16, ""):
        with pytest.raises(ProtocolError):
            handshake.worker_proof(key, ours, bad_nonce, 7, "tiny")
        assert not handshake.router_proven(key, ours, bad_nonce, 7, router)
    nonce = handshake.new_nonce()
    assert len(bytes.fromhex(nonce)) == 32 and nonce != handshake.new_nonce()
    reg = proto.Register(7, "cpu", "tiny", [1], 7, 64, 64, [2], auth=worker).to_wire()
    assert reg["auth"] == worker
    assert "auth" not in proto.Register(7, "cpu", "tiny", [1], 7, 64, 64, [2]).to_wire()


def test_worker_secret_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    from nitsum.worker.__main__ import worker_secret

    monkeypatch.delenv(proto.SECRET_ENV, raising=False)
    assert worker_secret(None) is None
    monkeypatch.setenv(proto.SECRET_ENV, " from-env-0123456789 ")
    assert worker_secret(None) == b"from-env-0123456789"
    f = tmp_path / "secret"
    f.write_text("from-file-0123456789\n")
    assert worker_secret(str(f)) == b"from-file-0123456789"
