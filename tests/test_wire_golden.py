"""The golden wire fixtures (tests/golden/wire/) against the Python message dataclasses.

The router's Rust types are checked against the same files by `cargo test wire_golden`, so a
field renamed, added or retyped on one side only fails one of the two.
"""

from __future__ import annotations

import dataclasses
import json
import typing

import msgpack
import pytest

from nitsum.sampling import SamplingParams
from nitsum.structured.spec import GrammarSpec
from nitsum.worker import inbound
from nitsum.worker import protocol as proto
from nitsum.worker.stats import Stats
from wire_golden import GOLDEN_DIR, all_wire

TYPES: dict[str, type[proto.Message]] = {
    m.TYPE: m
    for m in (
        proto.Hello,
        proto.Register,
        proto.Heartbeat,
        proto.DeviceLost,
        proto.Tokens,
        proto.Reconfigured,
        Stats,
        proto.Generate,
    )
} | proto.ROUTER_MESSAGES
GOLDEN = all_wire()
TYPED = sorted(GOLDEN)


def fixture(name: str) -> bytes:
    return (GOLDEN_DIR / f"{name}.msgpack").read_bytes()


def test_one_fixture_per_golden_message_and_every_type_covered():
    on_disk = {p.stem for p in GOLDEN_DIR.glob("*.msgpack")}
    assert on_disk == set(GOLDEN), "run scripts/regen_wire_fixtures.py after a deliberate change"
    assert {w["type"] for w in GOLDEN.values()} == set(TYPES)
    for name in GOLDEN:  # the JSON twins say the same
        twin = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
        assert twin == proto.decode(fixture(name)), name


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_python_built_message_encodes_to_the_fixture(name):
    assert proto.encode(GOLDEN[name]) == fixture(name), (
        f"{name}: the Python message no longer matches tests/golden/wire/{name}.msgpack:\n"
        f"  built:   {GOLDEN[name]}\n  fixture: {msgpack.unpackb(fixture(name))}"
    )


@pytest.mark.parametrize("name", TYPED)
def test_the_fixture_decodes_into_its_dataclass_and_back_byte_for_byte(name):
    wire = proto.decode(fixture(name))
    msg = TYPES[wire["type"]].from_wire(wire)
    assert proto.encode(msg.to_wire()) == fixture(name)


def test_the_fixtures_set_every_field_of_every_type():
    """No field falls back to its default in all of its type's fixtures (unchecked then),
    nested parts (`generate`'s `sampling`, `contract`, ...) included."""
    keys: dict[str, set[str]] = {}
    for name in TYPED:
        wire = proto.decode(fixture(name))
        keys.setdefault(wire["type"], set()).update(set(wire) - {"v", "type"})
    for kind, seen in keys.items():
        assert seen == set(TYPES[kind].__dataclass_fields__), kind
    gen = proto.decode(fixture("generate"))
    for part in ("sampling", "stop", "output", "contract", "routing"):
        cls = typing.get_type_hints(proto.Generate)[part]
        wire_keys = {f.metadata.get("key") or f.name for f in dataclasses.fields(cls)}
        assert set(gen[part]) == wire_keys, part


def test_the_generate_fixture_parses_into_the_request_it_describes():
    req = inbound.parse_generate(proto.decode(fixture("generate")))
    spec = req.spec
    assert (req.request_id, req.input_ids, spec.tier, spec.slo_class) == (
        "0123456789abcdef0123456789abcdef",
        [1, 15, 27, 3],
        "gold",
        "feasible",
    )
    assert (spec.decode_target, spec.ttft_ms, spec.tpot_ms, spec.weight) == (2, 250.0, 40.0, 2.5)
    assert (spec.priority, spec.may_preempt) == (-1, False)
    assert (spec.bind_tp, spec.fork_of) == (2, "fedcba9876543210fedcba9876543210")
    assert (spec.truncate_prompt_tokens, spec.cache_salt) == (3, "tenant-a")
    assert spec.sampling == SamplingParams(
        max_tokens=32, temperature=0.5, top_p=0.75, top_k=40, seed=1234, stop_token_ids=(2, 13),
        ignore_eos=False, presence_penalty=0.25, frequency_penalty=-0.5,
        repetition_penalty=1.25, logit_bias=((7, 2.5),), min_tokens=3, min_p=0.125, logprobs=2,
        resumed_tokens=1, prompt_logprobs=1, allowed_token_ids=(5, 9, 27),
        bad_words=((13,), (15, 27)),
        no_repeat_ngram_size=3,
        grammar=GrammarSpec("json_schema", '{"type":"object"}', replay=1),
    )  # fmt: skip
