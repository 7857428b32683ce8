"""Our forward pass against transformers' reference implementation (fp32, tiny configs)."""

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.sampling import SamplingParams
from tiny import VARIANTS, make_tiny


def all_logits(engine, seq: Sequence, start: int, q_len: int) -> torch.Tensor:
    """Logits of every row of one chunk, through the paged engine path."""
    runner = engine.runner
    engine.scheduler._reserve(seq, start + q_len, protected=None)
    inputs = runner.prepare([Scheduled(seq, start, q_len)])
    # NOTE: `prepare` builds host tensors; the runner moves them to its device in a step.
    dev = runner.model.weights.embed.device
    hidden = runner.model.forward(
        runner.ctx,
        inputs.input_ids.to(dev),
        inputs.positions.to(dev),
        inputs.meta.to(dev),
        runner.pool,
    )
    seq.num_computed = start + q_len
    return runner.model.logits(hidden)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_logits_match_transformers(variant):
    hf, cfg = make_tiny(variant)
    engine = build_engine(cfg, hf.state_dict().items(), EngineConfig(kv_cache_bytes=1 << 20))
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    seq = Sequence("r", ids.tolist(), RequestSpec(SamplingParams()))
    ours = all_logits(engine, seq, 0, len(ids))
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("variant", ["llama-gqa", "qwen2-bias", "llama3-rope"])
def test_chunked_prefill_and_decode_match_transformers(variant):
    """Chunks that cross page boundaries, then single-token decodes, read back the pages."""
    hf, cfg = make_tiny(variant)
    engine = build_engine(
        cfg, hf.state_dict().items(), EngineConfig(kv_cache_bytes=1 << 20, page_tokens=4)
    )
    ids = torch.randint(0, cfg.vocab_size, (50,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    seq = Sequence("r", ids[:45].tolist(), RequestSpec(SamplingParams()))
    got = [all_logits(engine, seq, 0, 13), all_logits(engine, seq, 13, 32)]
    for pos in range(45, 50):
        seq.output_ids.append(int(ids[pos]))
        got.append(all_logits(engine, seq, pos, 1))
    ours = torch.cat(got)
    assert ours.shape == (50, cfg.vocab_size)
    # The last row predicts past the prompt: compare rows 0..48 where both saw the same inputs.
    assert (ours[:45] - ref[:45]).abs().max().item() <= 1e-4
    assert (ours[45:50] - ref[45:50]).abs().max().item() <= 1e-4
