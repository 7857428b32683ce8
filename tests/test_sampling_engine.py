"""Sampling fields through the engine on a tiny model: logit_bias forces a token, min_tokens
delays EOS, penalties decode as a reference loop over the HF model predicts, logprobs are
the HF model's log-softmax, and n > 1 sibling choices share one prefill (engine/forks.py)."""

from __future__ import annotations

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams
from tiny import make_tiny, random_prompt

P = 4  # tokens per page


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def engine_for(tiny, caching: bool = True):
    hf, cfg = tiny
    ecfg = EngineConfig(
        kv_cache_bytes=1 << 20, page_tokens=P, token_budget=64, prefix_caching=caching
    )
    return build_engine(cfg, hf.state_dict().items(), ecfg)


def run(engine, requests: dict[str, tuple[list[int], SamplingParams, str | None]]):
    """Add every request (prompt, params, fork_of), step to the end: per request its
    tokens, finish reason, logprobs and the prompt tokens computed for it."""
    for rid, (prompt, params, fork_of) in requests.items():
        engine.add_request(rid, prompt, RequestSpec(params, fork_of=fork_of))
    out = {rid: ([], None, [], 0) for rid in requests}
    while engine.has_unfinished():
        batch = engine.begin_step()
        for s in batch:
            prompt_len = len(requests[s.seq.request_id][0])
            if s.start < prompt_len:
                ids, fin, lps, computed = out[s.seq.request_id]
                out[s.seq.request_id] = (ids, fin, lps, computed + min(s.q_len, prompt_len))
        for o in engine.end_step(batch, engine.runner.run(batch), 0.0):
            ids, _, lps, computed = out[o.request_id]
            out[o.request_id] = (
                ids + o.new_token_ids,
                o.finish_reason,
                lps + (o.logprobs or []),
                computed,
            )
    return out


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


def test_logit_bias_of_100_forces_its_token(tiny) -> None:
    _, cfg = tiny
    prompt = random_prompt(cfg, 9, seed=3)
    p = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logit_bias=((77, 100.0),))
    ids, *_ = run(engine_for(tiny), {"a": (prompt, p, None)})["a"]
    assert ids == [77] * 5
    # Sampled too (not only greedy): +100 leaves every other token ~e^-100 as likely.
    p = SamplingParams(max_tokens=5, temperature=1.0, seed=1, logit_bias=((77, 100.0),))
    ids, *_ = run(engine_for(tiny), {"b": (prompt, p, None)})["b"]
    assert ids == [77] * 5


def test_min_tokens_delays_eos(tiny) -> None:
    _, cfg = tiny
    eos = cfg.eos_token_ids[0]
    prompt = random_prompt(cfg, 9, seed=4)
    # The bias makes EOS the greedy pick at every step: it ends at once without min_tokens.
    # NOTE: EOS among the stop ids, as the router sends it (the engine adds none).
    kw = {
        "max_tokens": 10,
        "temperature": 0,
        "logit_bias": ((eos, 100.0),),
        "stop_token_ids": (eos,),
    }
    now = SamplingParams(**kw)
    later = SamplingParams(**kw, min_tokens=4)
    got = run(engine_for(tiny), {"now": (prompt, now, None), "later": (prompt, later, None)})
    assert got["now"][:2] == ([eos], "stop")
    ids, finish, *_ = got["later"]
    assert len(ids) == 5 and eos not in ids[:4] and ids[4] == eos and finish == "stop"


def reference_decode(hf, prompt: list[int], n: int, freq: float, pres: float, rep: float):
    """Greedy decoding over the HF model with vLLM's penalties, one token at a time."""
    out: list[int] = []
    for _ in range(n):
        logits = hf_logits(hf, prompt + out)
        seen = set(prompt) | set(out)
        for t in seen:
            logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
        for t in set(out):
            logits[t] -= freq * out.count(t) + pres
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize(
    ("freq", "pres", "rep"), [(1.5, 0.0, 1.0), (0.0, 2.0, 1.0), (0.0, 0.0, 1.8), (0.5, 0.5, 1.3)]
)
def test_penalties_decode_as_the_reference_predicts(tiny, freq, pres, rep) -> None:
    hf, cfg = tiny
    prompt = random_prompt(cfg, 7, seed=5)
    n = 12
    plain = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    p = SamplingParams(
        max_tokens=n,
        temperature=0,
        ignore_eos=True,
        frequency_penalty=freq,
        presence_penalty=pres,
        repetition_penalty=rep,
    )
    got = run(engine_for(tiny), {"plain": (prompt, plain, None), "pen": (prompt, p, None)})
    want = reference_decode(hf, prompt, n, freq, pres, rep)
    assert got["pen"][0] == want
    assert got["plain"][0] == reference_decode(hf, prompt, n, 0.0, 0.0, 1.0)
    assert got["pen"][0] != got["plain"][0]  # the penalty changed the output


def test_a_resumed_request_goes_on_as_if_never_interrupted(tiny) -> None:
    """A worker death mid-stream: the router resumes the request on another worker with
    prompt ‖ streamed tokens, `max_tokens` and `min_tokens` lowered, `resumed_tokens` set.
    The penalties must count the streamed tokens as output: the rest of the output is the
    uninterrupted run's."""
    hf, cfg = tiny
    prompt = random_prompt(cfg, 7, seed=5)
    n, k = 12, 5
    pen = dict(temperature=0, ignore_eos=True, frequency_penalty=1.5, presence_penalty=0.5)
    whole = run(engine_for(tiny), {"a": (prompt, SamplingParams(max_tokens=n, **pen), None)})
    ids = whole["a"][0]
    rest = SamplingParams(max_tokens=n - k, resumed_tokens=k, **pen)
    resumed = run(engine_for(tiny), {"b": (prompt + ids[:k], rest, None)})
    assert resumed["b"][0] == ids[k:]
    # Without `resumed_tokens` the streamed tokens count as prompt, and the output changes.
    naive = run(
        engine_for(tiny), {"c": (prompt + ids[:k], SamplingParams(max_tokens=n - k, **pen), None)}
    )
    assert naive["c"][0] != ids[k:]
    # The resumed tokens are the end of a prompt: they cannot be all of it.
    with pytest.raises(InvalidRequestError) as e:
        engine_for(tiny).add_request("d", ids[:k], RequestSpec(rest))
    assert e.value.field == "resumed_tokens"


def test_prompt_logprobs_are_the_models_across_chunks_and_despite_the_prefix_cache(tiny) -> None:
    """OpenAI's echo with logprobs: each prompt token after the first gets the model's
    log-softmax at the position before it, over a prompt longer than one step's budget
    (chunked prefill), and again for a second request of the same prompt, which would
    otherwise be served from the prefix cache."""
    hf, cfg = tiny
    prompt = random_prompt(cfg, 150, seed=3)  # > token_budget (64): three chunks
    p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=2)
    engine = engine_for(tiny)
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    for rid in ("first", "again"):
        engine.add_request(rid, prompt, RequestSpec(p))
        firsts = []
        while engine.has_unfinished():
            batch = engine.begin_step()
            firsts += [o for o in engine.end_step(batch, engine.runner.run(batch), 0.0)]
        got = next(o.prompt_logprobs for o in firsts if o.prompt_logprobs is not None)
        assert len(got) == len(prompt) - 1
        for j, lp in enumerate(got):
            assert lp.logprob == pytest.approx(float(want[j, prompt[j + 1]]), abs=1e-4)
            top = want[j].topk(2)
            assert [t for t, _ in lp.top] == top.indices.tolist()
    # A request without it gets none, and shares the cache as before.
    engine.add_request("plain", prompt, RequestSpec(SamplingParams(max_tokens=1, temperature=0)))
    batch = engine.begin_step()
    assert batch[0].start > 0  # served from the prefix cache
    outs = engine.end_step(batch, engine.runner.run(batch), 0.0)
    assert all(o.prompt_logprobs is None for o in outs)


def test_logprobs_are_the_models_log_softmax(tiny) -> None:
    hf, cfg = tiny
    prompt = random_prompt(cfg, 11, seed=6)
    p = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=5)
    ids, _, lps, _ = run(engine_for(tiny), {"a": (prompt, p, None)})["a"]
    assert len(lps) == len(ids) == 6
    for i, (token, lp) in enumerate(zip(ids, lps, strict=True)):
        ref = torch.log_softmax(hf_logits(hf, prompt + ids[:i]), dim=-1)
        assert lp.logprob == pytest.approx(float(ref[token]), abs=1e-4)
        top = ref.topk(5)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert lp.top[0][0] == token  # greedy: the chosen token is the most likely
    # A request that did not ask gets none.
    plain = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    assert run(engine_for(tiny), {"b": (prompt, plain, None)})["b"][2] == []


def test_sibling_choices_share_the_first_choices_prefill(tiny) -> None:
    _, cfg = tiny
    prompt = random_prompt(cfg, 23, seed=7)  # 5 full pages before its last token
    shared = (len(prompt) - 1) // P * P
    g = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine = engine_for(tiny)
    got = run(engine, {"c0": (prompt, g, None), "c1": (prompt, g, "c0"), "c2": (prompt, g, "c0")})
    assert got["c0"][3] == len(prompt) == 23
    assert got["c1"][3] == got["c2"][3] == len(prompt) - shared == 3
    cache = engine.scheduler.cache
    assert cache.hits == 2 * shared == 40
    # Same prompt, greedy: every choice decodes the same tokens, as without sharing.
    alone = run(engine_for(tiny, caching=False), {"x": (prompt, g, None)})["x"][0]
    assert got["c0"][0] == got["c1"][0] == got["c2"][0] == alone
    # Every page went back: nothing leaked by the shared references.
    assert engine.scheduler.kv.num_reclaimable() == engine.scheduler.pages.num_pages


def test_a_sibling_without_its_first_choice_runs_on_its_own(tiny) -> None:
    _, cfg = tiny
    prompt = random_prompt(cfg, 10, seed=8)
    g = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    got = run(engine_for(tiny), {"c1": (prompt, g, "gone")})
    assert got["c1"][3] == 10 and len(got["c1"][0]) == 3
