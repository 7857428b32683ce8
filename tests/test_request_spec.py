"""RequestSpec: every `generate` field lands on its spec field (the one codec type-checks it),
and the worker serves what the spec says (here `truncate_prompt_tokens`)."""

from __future__ import annotations

import dataclasses

import pytest

from nitsum.codec import ProtocolError
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import CLASSES, RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.pool.local import local_engine
from nitsum.sampling import SamplingParams
from nitsum.worker import inbound
from nitsum.worker import protocol as proto
from nitsum.worker.backend import PoolBackend
from tiny import hf_greedy, make_tiny, random_prompt


def generate(part: str | None = None, **extra: object) -> dict:
    """A `generate` as the worker decodes it, with `extra` fields in its `part` map (None:
    at the top level)."""
    msg = proto.generate("r1", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    msg = {**msg, **extra} if part is None else {**msg, part: {**msg[part], **extra}}
    return proto.decode(proto.encode(msg))


def test_absent_fields_take_the_declared_defaults() -> None:
    spec = inbound.parse_generate(generate()).spec
    assert spec == RequestSpec(SamplingParams(max_tokens=4, temperature=0))
    bare = {"v": 1, "type": "generate", "request_id": "r1", "input_ids": [1]}
    assert inbound.parse_generate(bare).spec == RequestSpec()


@pytest.mark.parametrize(
    "part, key, value, attr, want",
    [
        ("contract", "class", "background", "slo_class", "background"),
        ("contract", "ttft_ms", 250, "ttft_ms", 250.0),  # a loose encoder's integer: a float
        ("contract", "tpot_ms", 40, "tpot_ms", 40.0),
        ("contract", "weight", 2, "weight", 2.0),
        ("contract", "preempt", False, "may_preempt", False),
        ("contract", "priority", -3, "priority", -3),
        ("contract", "bind_tp", 4, "bind_tp", 4),
        ("routing", "fork_of", "r0", "fork_of", "r0"),
        ("routing", "decode_target", 2, "decode_target", 2),
        ("routing", "cache_salt", "t", "cache_salt", "t"),
        (None, "truncate_prompt_tokens", 2, "truncate_prompt_tokens", 2),
    ],
)
def test_each_wire_field_lands_on_its_spec_field(part, key, value, attr, want) -> None:
    got = getattr(inbound.parse_generate(generate(part, **{key: value})).spec, attr)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "part, key, value",
    [
        ("contract", "class", "gold"),
        ("contract", "tier", 3),
        ("contract", "ttft_ms", "soon"),
        ("contract", "weight", None),
        ("contract", "priority", 1.5),
        ("contract", "priority", True),  # a bool is not an integer here
        ("contract", "preempt", 1),
        ("routing", "decode_target", "2"),
        (None, "truncate_prompt_tokens", "2"),
    ],
)
def test_a_malformed_value_is_refused_naming_its_field(part, key, value) -> None:
    """The codec's ProtocolError names the field; value ranges (ttft_ms > 0, bind_tp >= 1,
    ...) are the router's to check (api/), once."""
    with pytest.raises(ProtocolError) as e:
        inbound.parse_generate(generate(part, **{key: value}))
    path = key if part is None else f"{part}.{key}"
    assert str(e.value).startswith(f"generate: {path} must be ") and repr(value) in str(e.value)


def test_the_spec_is_frozen_and_checks_its_class() -> None:
    spec = RequestSpec(slo_class=CLASSES[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.priority = 3  # type: ignore[misc]
    with pytest.raises(InvalidRequestError):
        RequestSpec(slo_class="urgent")
    assert spec.prompt([5, 6, 7]) == [5, 6, 7]
    assert dataclasses.replace(spec, truncate_prompt_tokens=2).prompt([5, 6, 7]) == [6, 7]


def test_truncate_prompt_tokens_serves_the_last_k_prompt_tokens() -> None:
    """Through the worker's path (wire message -> PoolBackend -> PoolEngine): a request with
    `truncate_prompt_tokens: k` continues exactly the last k prompt tokens, which differs
    from continuing the whole prompt."""
    hf, cfg = make_tiny("llama-gqa")
    ids = random_prompt(cfg, 24, seed=5)
    backend = PoolBackend(local_engine(cfg, hf.state_dict().items(), EngineConfig(page_tokens=4)))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for rid, extra in (("whole", {}), ("cut", {"truncate_prompt_tokens": 7})):
        msg = proto.decode(proto.encode(proto.generate(rid, ids, params)))
        backend.add(0, inbound.parse_generate({**msg, **extra}))
    out: dict[str, list[int]] = {}
    while backend.has_unfinished():
        for o in backend.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert out["whole"] == hf_greedy(hf, ids, 6)
    assert out["cut"] == hf_greedy(hf, ids[-7:], 6)
    assert out["cut"] != out["whole"]
