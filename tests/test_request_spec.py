"""RequestSpec: every `generate` field is checked by its declaration, and the worker serves
what the spec says (here `truncate_prompt_tokens`, a field added with no parser edit)."""

from __future__ import annotations

import dataclasses

import pytest

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import CLASSES, RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.pool.local import local_engine
from nitsum.sampling import SamplingParams
from nitsum.worker import inbound
from nitsum.worker import protocol as proto
from nitsum.worker.backend import PoolBackend
from tiny import hf_greedy, make_tiny, random_prompt


def generate(**extra: object) -> dict:
    """A `generate` as the worker decodes it, with `extra` top-level fields."""
    msg = proto.generate("r1", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    return proto.decode(proto.encode({**msg, **extra}))


def test_absent_fields_take_the_declared_defaults() -> None:
    spec = inbound.parse_generate(generate()).spec
    assert spec == RequestSpec(SamplingParams(max_tokens=4, temperature=0))
    # Every wire key is a declared field with a default, so a message without it is valid.
    assert RequestSpec.wire_keys() == {
        "tier": "",
        "class": "feasible",
        "ttft_ms": None,
        "tpot_ms": None,
        "weight": 1.0,
        "priority": 0,
        "preempt": True,
        "bind_tp": None,
        "fork_of": None,
        "decode_target": None,
        "truncate_prompt_tokens": None,
        "cache_salt": None,
    }


@pytest.mark.parametrize(
    "key, value, attr, want",
    [
        ("class", "background", "klass", "background"),
        ("ttft_ms", 250, "ttft_ms", 250.0),  # an integer from a loose encoder is a float
        ("tpot_ms", 40, "tpot_ms", 40.0),
        ("weight", 2, "weight", 2.0),
        ("preempt", False, "may_preempt", False),
        ("priority", -3, "priority", -3),
        ("bind_tp", 4, "bind_tp", 4),
        ("fork_of", "r0", "fork_of", "r0"),
        ("decode_target", 2, "decode_target", 2),
        ("truncate_prompt_tokens", 2, "truncate_prompt_tokens", 2),
    ],
)
def test_each_wire_field_lands_on_its_spec_field(key, value, attr, want) -> None:
    got = getattr(inbound.parse_generate(generate(**{key: value})).spec, attr)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "key, value",
    [
        ("class", "gold"),
        ("tier", 3),
        ("ttft_ms", 0),
        ("ttft_ms", "soon"),
        ("tpot_ms", -1),
        ("weight", 0),
        ("weight", None),
        ("priority", 1.5),
        ("priority", True),  # a bool is not an integer here
        ("preempt", 1),
        ("bind_tp", 0),
        ("fork_of", ""),
        ("decode_target", "2"),
        ("truncate_prompt_tokens", 0),
        ("truncate_prompt_tokens", -1),
    ],
)
def test_a_bad_value_is_refused_naming_its_wire_key(key, value) -> None:
    with pytest.raises(InvalidRequestError) as e:
        inbound.parse_generate(generate(**{key: value}))
    assert e.value.field == key and repr(value) in str(e.value)


def test_the_spec_is_frozen_and_checks_its_class() -> None:
    spec = RequestSpec(klass=CLASSES[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.priority = 3  # type: ignore[misc]
    with pytest.raises(InvalidRequestError):
        RequestSpec(klass="urgent")
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
