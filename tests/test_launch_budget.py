"""Kernel launches per decode layer on the path CUDA runs (fused Triton ops + Triton attention),
counted on CPU with Triton's interpreter: at most `BUDGET`.

What counts as a launch:
- every ATen op dispatched during the model's forward (a `TorchDispatchMode`), except the
  ones that never launch a kernel: views and metadata (`NO_KERNEL`: view, reshape as a
  view, as_strided, t/transpose/permute, (un)squeeze, select/slice/unbind, expand, detach,
  alias) and bare allocations (empty, empty_like, empty_strided: the caching allocator, no
  kernel). A copy that `reshape`/`contiguous` makes shows up as its own op (clone/copy_)
  and counts;
- every Triton kernel launch (`run` of a jitted function, compiled or interpreted);
- NOT the ATen ops Triton's interpreter issues while it runs a launch (its tensor copies):
  they are the interpreter's, not the model's, and are dropped while a launch is in flight.

Per layer = launches of a 3-layer model's decode step − those of a 2-layer model's (the
embedding, final norm and LM head cancel out).

Measured here (batch-1 decode, bf16): the fused path 9 per layer (add+norm, qkv mm,
rotary+KV write, attention (flash-decoding's split kernel; a context long enough to split
adds its merge kernel, 10), o-proj mm, add+norm, gate_up mm, SiLU·mul, down mm); the
unfused torch elementwise path around the same Triton attention 34 (each bf16 RMSNorm 8:
_to_copy, pow, mean, add, rsqrt, mul, _to_copy, mul; rotary 5: neg, cat, 2 mul, add; two
clones for reshape/contiguous; two index_copy_ K/V writes; silu, mul; two residual add_;
4 mm; attention), which fails the budget (the second test: the counter really counts).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)

from nitsum.config import ModelConfig  # noqa: E402
from nitsum.engine.build import build_engine  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from nitsum_kernels.paged_attention_triton import paged_attention_triton  # noqa: E402
from tiny import BASE, EAGER_STEPS  # noqa: E402

BUDGET = 12
DEV = "cuda" if torch.cuda.is_available() else "cpu"
aten = torch.ops.aten
NO_KERNEL = {
    aten.view,
    aten._unsafe_view,
    aten._reshape_alias,
    aten.as_strided,
    aten.t,
    aten.transpose,
    aten.permute,
    aten.unsqueeze,
    aten.squeeze,
    aten.select,
    aten.slice,
    aten.unbind,
    aten.split,
    aten.expand,
    aten.detach,
    aten.alias,
    aten.lift_fresh,
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
}


class LaunchCounter(TorchDispatchMode):
    """Counts kernel-launching ATen ops and Triton launches (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.in_launch = 0
        self.dropped = 0  # ATen ops the Triton interpreter ran inside launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # NOTE: composite ops (linear, reshape, contiguous, to...) reach the mode whole; run
        # their decomposition so what they really dispatch is counted (a no-op `to` or a
        # view-`reshape` nothing, `linear` its mm).
        # The mode is off inside its own handler: re-enter it so the parts are seen.
        with self:
            out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        if self.in_launch:
            self.dropped += 1
        elif func.overloadpacket not in NO_KERNEL:
            self.ops.append(str(func.overloadpacket))
        return func(*args, **kwargs)


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[LaunchCounter]:
    counter = LaunchCounter()
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime.interpreter import InterpretedFunction as Kernel
    else:
        from triton.runtime.jit import JITFunction as Kernel
    run = Kernel.run

    def counted_run(self, *args, **kwargs):
        if kwargs.get("warmup"):
            return run(self, *args, **kwargs)
        counter.ops.append(f"triton:{self.__name__}")
        counter.in_launch += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.in_launch -= 1

    monkeypatch.setattr(Kernel, "run", counted_run)
    with counter:
        yield counter
    monkeypatch.setattr(Kernel, "run", run)


INTERPRETER_OPS: list[int] = []  # per counted forward: the ATen ops dropped inside launches


def decode_step_launches(monkeypatch, layers: int, fused: bool) -> list[str]:
    """The launches of a batch-1 decode step's forward (after a 7-token prefill), bf16."""
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**{**BASE, "num_hidden_layers": layers})).eval()
    cfg = ModelConfig.from_hf(hf.config.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    # NOTE: the eager forward, also on CUDA: what a graph records is this forward's launches.
    ecfg = EngineConfig(
        dtype=torch.bfloat16,
        device=DEV,
        kv_cache_bytes=1 << 20,
        page_tokens=4,
        fused_ops=fused,
        **EAGER_STEPS,
    )
    engine = build_engine(cfg, hf.state_dict().items(), ecfg)
    model = engine.runner.model
    model.paged_attention = paged_attention_triton  # what CUDA runs, fused or not
    engine.add_request(
        "r", list(range(7)), RequestSpec(SamplingParams(max_tokens=3, temperature=0))
    )
    engine.step()  # the prefill
    forward = model.forward
    seen: list[list[str]] = []

    def counted_forward(*args, **kwargs):
        with counting(monkeypatch) as counter:
            out = forward(*args, **kwargs)
        seen.append(counter.ops)
        INTERPRETER_OPS.append(counter.dropped)
        return out

    monkeypatch.setattr(model, "forward", counted_forward)
    engine.step()  # one decode
    assert len(seen) == 1
    return seen[0]


def per_layer(monkeypatch, fused: bool) -> tuple[int, list[str]]:
    three = decode_step_launches(monkeypatch, 3, fused)
    two = decode_step_launches(monkeypatch, 2, fused)
    return len(three) - len(two), three


def test_fused_decode_layer_fits_the_launch_budget(monkeypatch):
    n, ops = per_layer(monkeypatch, fused=True)
    assert n <= BUDGET, f"{n} launches per decode layer: {ops}"
    assert n == 9, ops  # the nine of the module docstring: a change here is worth a look
    triton_ops = [o for o in ops if o.startswith("triton:")]
    assert "triton:_rotary_kv_kernel" in triton_ops and "triton:_split_kernel" in triton_ops
    assert not any("index_copy" in o for o in ops)  # the rotary kernel wrote K/V
    if os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter's own tensor ops (hundreds a step) were there, and not counted.
        assert INTERPRETER_OPS[-1] > len(ops)


def test_unfused_decode_layer_exceeds_the_budget(monkeypatch):
    """The counter counts: the torch elementwise ops around the same attention are far over."""
    n, ops = per_layer(monkeypatch, fused=False)
    assert n > BUDGET, f"only {n} launches per unfused layer: {ops}"
