"""The state a prefilled request carries to its decode process besides its KV (P/D across
host worker processes, remote_handoff.py): its whole spec and the sequence's state, as a
msgpack-able dict, and the running sequence it describes on the other side."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from nitsum.engine.generate_message import Generate
from nitsum.engine.sequence import Sequence, Status
from nitsum.structured.start import start_grammar


def handoff_meta(seq: Sequence, target: int) -> dict[str, Any]:
    """What the receiver needs besides the KV to go on exactly where this process stopped:
    the whole spec as a `generate` message (engine/generate_message.py, without the prompt,
    which rides beside it; NOTE: the grammar as its wire form, the receiver replays the
    output into a fresh matcher) and the sequence's state."""
    generator = seq.generator.get_state().numpy().tobytes() if seq.generator is not None else None
    return {
        "target": target,
        "request_id": seq.request_id,
        "prompt_ids": seq.prompt_ids,
        "output_ids": seq.output_ids,
        "num_computed": seq.num_computed,
        # NOTE: the class as it is now (the scheduler may have demoted it).
        "spec": Generate.of(
            seq.request_id, [], replace(seq.spec, slo_class=seq.slo_class)
        ).to_wire(),
        "generator": generator,
    }


def handoff_sequence(meta: dict[str, Any]) -> Sequence:
    """The running sequence a handoff describes (pages still to be given)."""
    spec = Generate.from_wire(meta["spec"]).spec()
    seq = Sequence(meta["request_id"], list(meta["prompt_ids"]), spec)
    seq.output_ids = list(meta["output_ids"])
    # The grammar where the sender's was: started on the prompt, then over the output so far.
    seq.grammar = start_grammar(spec.sampling.grammar, seq.prompt_ids)
    if seq.grammar is not None and seq.output_ids and not seq.grammar.consume(seq.output_ids):
        raise ValueError(f"handoff of {seq.request_id}: its output breaks its grammar")
    seq.num_computed = int(meta["num_computed"])
    seq.status = Status.RUNNING
    if meta["generator"] is not None:
        seq.generator = torch.Generator()
        seq.generator.set_state(torch.frombuffer(bytearray(meta["generator"]), dtype=torch.uint8))
    return seq
