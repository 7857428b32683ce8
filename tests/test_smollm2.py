"""End to end on the real embedded model (SmolLM2-135M-Instruct), fp32 on CPU."""

import pytest
import torch

from nitsum.llm import LLM
from nitsum.sampling import SamplingParams

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    return LLM(smollm2_dir, kv_cache_mb=64)


def test_paris_and_first_20_ids_equal_transformers(llm, smollm2_dir):
    from transformers import AutoModelForCausalLM

    out = llm.chat(QUESTION, SamplingParams(max_tokens=20, temperature=0))[0]
    assert "Paris" in out.text
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([out.prompt_token_ids]), max_new_tokens=20, do_sample=False)[
            0, len(out.prompt_token_ids) :
        ].tolist()
    assert out.token_ids == ref[: len(out.token_ids)]
    assert len(out.token_ids) == 20 or out.finish_reason == "stop"


def test_batched_chats_equal_solo(llm):
    questions = ["Name a color.", "What is 2+2?", "Say hello in French."]
    convs = [[{"role": "user", "content": q}] for q in questions]
    params = SamplingParams(max_tokens=12, temperature=0)
    together = [c.token_ids for c in llm.chat(convs, params)]
    solo = [llm.chat(c, params)[0].token_ids for c in convs]
    assert together == solo
