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


def test_eos_is_added_once_by_the_in_process_api_and_never_by_the_engine(llm):
    """EOS has one owner per path: the router adds it to a served request's stop ids, and
    `LLM.generate` to an in-process one; the engine stops on the stop ids only."""
    from nitsum.engine.request_spec import RequestSpec

    eos = llm.eos_token_ids[0]
    force = SamplingParams(max_tokens=4, temperature=0, logit_bias=((eos, 100.0),))
    out = llm.generate([[1, 2, 3]], force)[0]
    assert (out.token_ids, out.finish_reason) == ([eos], "stop")
    kept = llm.generate([[1, 2, 3]], SamplingParams(**{**force.__dict__, "ignore_eos": True}))[0]
    assert (kept.token_ids, kept.finish_reason) == ([eos] * 4, "length")
    # The engine alone (as the worker runs it): no EOS among the stop ids, no stop on EOS.
    llm.engine.add_request("bare", [1, 2, 3], RequestSpec(force))
    got: list[int] = []
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            got += o.new_token_ids
    assert got == [eos] * 4
