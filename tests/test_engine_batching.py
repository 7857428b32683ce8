"""Continuous batching, abort, page accounting and input validation on a tiny model."""

import time

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams
from tiny import hf_greedy, make_tiny, run_to_completion

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def prompts(cfg, n=8):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, cfg.vocab_size, (5 + 7 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def engine_for(tiny, **kw):
    hf, cfg = tiny
    ecfg = EngineConfig(kv_cache_bytes=kw.pop("kv", 1 << 20), page_tokens=4, **kw)
    return build_engine(cfg, hf.state_dict().items(), ecfg)


def assume_full_steps_take(engine, seconds: float) -> None:
    """Make the hopeless-prompt check see full-budget steps of `seconds` (real ones on the
    tiny model take milliseconds)."""
    engine.scheduler.full_steps.clear()
    engine.scheduler.full_steps.append(seconds)


def test_concurrent_requests_equal_solo_runs_and_transformers(tiny):
    hf, cfg = tiny
    ps = prompts(cfg)
    solo = {}
    for i, p in enumerate(ps):
        e = engine_for(tiny)
        e.add_request(f"r{i}", p, RequestSpec(GREEDY))
        solo[f"r{i}"] = run_to_completion(e)[0][f"r{i}"]
    # Small budget forces chunked prefill interleaved with decodes of others.
    e = engine_for(tiny, token_budget=16)
    for i, p in enumerate(ps):
        e.add_request(f"r{i}", p, RequestSpec(GREEDY))
    together, reasons = run_to_completion(e)
    assert together == solo
    assert set(reasons.values()) == {"length"}
    assert all(len(v) == 12 for v in together.values())
    assert solo["r3"] == hf_greedy(hf, ps[3], 12)
    assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages


def test_preemption_under_page_pressure_keeps_outputs(tiny):
    hf, cfg = tiny
    ps = prompts(cfg)
    full = engine_for(tiny)
    for i, p in enumerate(ps):
        full.add_request(f"r{i}", p, RequestSpec(GREEDY))
    ref, _ = run_to_completion(full)
    # A pool so small that not all sequences fit at once: recompute preemption kicks in.
    per_page = 2 * cfg.num_layers * 4 * cfg.num_kv_heads * cfg.head_dim * 4
    tight = engine_for(tiny, kv=per_page * 20)
    for i, p in enumerate(ps):
        tight.add_request(f"r{i}", p, RequestSpec(GREEDY))
    got, _ = run_to_completion(tight)
    assert got == ref
    assert tight.scheduler.num_reclaimable() == tight.scheduler.pages.num_pages


def test_abort_frees_pages_and_spares_others(tiny):
    hf, cfg = tiny
    ps = prompts(cfg, 3)
    e = engine_for(tiny)
    for i, p in enumerate(ps):
        e.add_request(f"r{i}", p, RequestSpec(GREEDY))
    early = [o for _ in range(2) for o in e.step()]
    assert e.scheduler.pages.num_free < e.scheduler.pages.num_pages
    assert e.abort("r1")
    assert not e.abort("r1")
    outs, _ = run_to_completion(e)
    assert "r1" not in outs
    for o in reversed(early):
        if o.request_id != "r1":
            outs[o.request_id][:0] = o.new_token_ids
    solo = engine_for(tiny)
    solo.add_request("r2", ps[2], RequestSpec(GREEDY))
    assert run_to_completion(solo)[0]["r2"] == outs["r2"]
    assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages


@pytest.mark.parametrize(
    "prompt, params, field",
    [
        ([], GREEDY, "prompt"),
        (list(range(256)), GREEDY, "prompt"),
        ([1, 999], GREEDY, "prompt"),
    ],
)
def test_bad_input_is_rejected_without_side_effects(tiny, prompt, params, field):
    hf, cfg = tiny
    e = engine_for(tiny)
    good = prompts(cfg, 1)[0]
    e.add_request("ok", good, RequestSpec(GREEDY))
    with pytest.raises(InvalidRequestError) as err:
        e.add_request(
            "bad", [t % 128 if field != "prompt" else t for t in prompt], RequestSpec(params)
        )
    assert err.value.field == field
    assert field in str(err.value)
    outs, _ = run_to_completion(e)
    assert outs["ok"] == hf_greedy(tiny[0], good, 12)


@pytest.mark.parametrize(
    "params, field",
    [
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(temperature=-0.5), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(temperature=float("inf")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
    ],
)
def test_bad_sampling_values_are_named_by_the_in_process_check(params, field):
    """The router checks a served request's values; the in-process LLM API (llm.py) checks
    its own with `SamplingParams.validate` before the engine sees them."""
    with pytest.raises(InvalidRequestError) as err:
        params.validate()
    assert err.value.field == field


def test_seeded_sampling_repeats_and_stop_tokens(tiny):
    hf, cfg = tiny
    p = prompts(cfg, 1)[0]
    params = SamplingParams(
        max_tokens=10, temperature=0.8, top_p=0.9, top_k=20, seed=7, ignore_eos=True
    )
    runs = []
    for _ in range(2):
        e = engine_for(tiny)
        e.add_request("s", p, RequestSpec(params))
        e.add_request(
            "noise", prompts(cfg, 2)[1], RequestSpec(SamplingParams(max_tokens=5, seed=None))
        )
        runs.append(run_to_completion(e)[0]["s"])
    assert runs[0] == runs[1]
    # Stop on a token id: cut right after its first occurrence in the greedy output.
    greedy = hf_greedy(hf, p, 12)
    stop = greedy[4]
    e = engine_for(tiny)
    e.add_request(
        "g", p, RequestSpec(SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop,)))
    )
    outs, reasons = run_to_completion(e)
    assert outs["g"] == greedy[: greedy.index(stop) + 1]
    assert reasons["g"] == "stop"


def test_a_denormal_temperature_is_greedy_and_does_not_fail_its_batch(tiny):
    """temperature 1e-40 overflowed the logits to inf (softmax NaN) and failed every request
    batched with it; below `GREEDY_BELOW` it is greedy, and its neighbours sample as usual."""
    hf, cfg = tiny
    ps = prompts(cfg, 3)
    sampled = SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True)
    e = engine_for(tiny)
    e.add_request(
        "tiny-t",
        ps[0],
        RequestSpec(SamplingParams(max_tokens=8, temperature=1e-40, ignore_eos=True)),
    )
    e.add_request(
        "greedy", ps[1], RequestSpec(SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    )
    e.add_request("sampled", ps[2], RequestSpec(sampled))
    outs, reasons = run_to_completion(e)
    assert outs["tiny-t"] == hf_greedy(hf, ps[0], 8)
    assert outs["greedy"] == hf_greedy(hf, ps[1], 8)
    solo = engine_for(tiny)
    solo.add_request("sampled", ps[2], RequestSpec(sampled))
    assert outs["sampled"] == run_to_completion(solo)[0]["sampled"]
    assert set(reasons.values()) == {"length"}


def test_a_request_past_its_ttft_deadline_is_served_last(tiny):
    """Local scheduler: a waiting request that missed its TTFT can no longer meet its SLO,
    so it is demoted to background and an on-time request goes first; it still finishes
    with the same tokens."""
    hf, cfg = tiny
    engine = engine_for(tiny, max_batch=1)
    ps = prompts(cfg, 2)
    engine.add_request(
        "late", ps[0], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=1.0)
    )
    engine.add_request(
        "on-time", ps[1], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=60_000.0)
    )
    engine.seqs["late"].deadline -= 1.0  # its TTFT ran out a second ago
    first = engine.step()
    assert [o.request_id for o in first] == ["on-time"]
    assert engine.seqs["late"].slo_class == "background"
    outs, _ = run_to_completion(engine)
    assert outs["late"] == hf_greedy(hf, ps[0], 12)
    assert first[0].new_token_ids + outs["on-time"] == hf_greedy(hf, ps[1], 12)


def test_a_prompt_that_cannot_make_its_ttft_is_served_last(tiny):
    """Local scheduler: with full-budget steps of at least 0.5 s, a 26-token prompt at 8
    tokens a step needs 4 steps, 3 of them full (at least 1.5 s): with a 1.2 s TTFT it is
    demoted before any work is spent on it, and the prompts behind it go first; one that can
    still make it (31 tokens ahead of and with it: at least 1.5 s, for a 1.8 s TTFT) is not.
    All still finish with the reference tokens."""
    hf, cfg = tiny
    engine = engine_for(tiny, max_batch=4, token_budget=8)
    ps = prompts(cfg, 4)
    assume_full_steps_take(engine, 0.5)
    engine.add_request(
        "hopeless", ps[3], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=1200.0)
    )
    engine.add_request(
        "first", ps[2], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=60_000.0)
    )
    engine.add_request(
        "tight", ps[1], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=1800.0)
    )
    engine.step()
    assert engine.seqs["hopeless"].slo_class == "background"
    assert engine.seqs["tight"].slo_class == "feasible"
    assert engine.seqs["hopeless"].num_computed == 0
    assert engine.seqs["first"].num_computed == 8
    outs, _ = run_to_completion(engine)
    for rid, p in (("hopeless", ps[3]), ("tight", ps[1])):
        assert outs[rid] == hf_greedy(hf, p, 12)


def test_a_started_prompt_that_cannot_make_its_ttft_yields_the_budget(tiny):
    """A prompt already being prefilled whose deadline becomes unreachable is demoted too:
    the next step's prompt budget goes to a feasible prompt admitted after it."""
    hf, cfg = tiny
    engine = engine_for(tiny, max_batch=4, token_budget=8)
    ps = prompts(cfg, 4)
    engine.add_request(
        "started", ps[3], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=60_000.0)
    )
    engine.step()
    assert engine.seqs["started"].num_computed == 8
    engine.add_request(
        "next", ps[2], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=60_000.0)
    )
    assume_full_steps_take(engine, 0.5)  # the step above took milliseconds
    # 18 tokens left: 3 steps, 2 of them full (at least 1 s).
    engine.seqs["started"].deadline = time.monotonic() + 0.8
    engine.step()
    assert engine.seqs["started"].slo_class == "background"
    assert engine.seqs["started"].num_computed == 8
    assert engine.seqs["next"].num_computed == 8
    outs, _ = run_to_completion(engine)
    assert outs["started"] == hf_greedy(hf, ps[3], 12)


def test_a_row_that_cannot_be_sampled_fails_only_its_own_request(tiny):
    """Per-row isolation: non-finite logits in one sampled row end that request with an
    error; the other rows of the batch keep their tokens and their requests go on."""
    from nitsum.sampling import SAMPLE_FAILED, sample

    hf, cfg = tiny
    logits = torch.zeros(3, 16)
    logits[0, 5] = 9.0
    logits[1] = float("nan")
    logits[2, 7] = 9.0
    p = SamplingParams(max_tokens=4, temperature=0.5, top_k=1)
    gens = [torch.Generator().manual_seed(0) for _ in range(3)]
    assert sample(logits, [p, p, p], gens) == [5, SAMPLE_FAILED, 7]
    # In the engine: the failed row's request ends with "error", its batch mates go on.
    engine = engine_for(tiny)
    ps = prompts(cfg, 2)
    engine.add_request("bad", ps[0], RequestSpec(GREEDY))
    engine.add_request("good", ps[1], RequestSpec(GREEDY))
    batch = engine.scheduler.schedule()
    outs = engine.complete_step(batch, [SAMPLE_FAILED, 42])
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outs] == [
        ("bad", [], "error"),
        ("good", [42], None),
    ]
    assert "bad" not in engine.seqs and engine.seqs["good"].output_ids == [42]
    assert engine.scheduler.num_reclaimable() + len(engine.seqs["good"].pages) == (
        engine.scheduler.pages.num_pages
    )


def test_a_started_lower_class_prompt_does_not_count_ahead_of_a_feasible_one(tiny):
    """The hopeless check follows the order the budget is given in: a feasible prompt that
    waits goes before a best-effort one already prefilling, so that one's tokens are not
    counted ahead of it. 12 tokens at 8 a step: at least 1 full step (0.5 s), within a 1 s
    TTFT (counting the best-effort prompt's 18 tokens ahead it would be 1.5 s)."""
    hf, cfg = tiny
    engine = engine_for(tiny, max_batch=4, token_budget=8)
    ps = prompts(cfg, 4)
    engine.add_request(
        "be", ps[3], RequestSpec(GREEDY, slo_class="best_effort", tier="relaxed", ttft_ms=60_000.0)
    )
    engine.step()
    assert engine.seqs["be"].num_computed == 8
    engine.add_request(
        "f", ps[1], RequestSpec(GREEDY, slo_class="feasible", tier="strict", ttft_ms=1000.0)
    )
    assume_full_steps_take(engine, 0.5)  # the step above took milliseconds
    engine.step()
    assert engine.seqs["f"].slo_class == "feasible"
    assert engine.seqs["f"].num_computed == 8, "the feasible prompt got the budget"
    outs, _ = run_to_completion(engine)
    assert outs["f"] == hf_greedy(hf, ps[1], 12)


def test_first_output_reports_how_long_the_request_queued(tiny):
    """`queue_s` (sent to the router as `queue_ms`, the queue / prefill split of `/metrics`)
    rides on a request's first output only, and covers its wait behind a full batch."""
    e = engine_for(tiny, max_batch=1)
    p = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    e.add_request("a", [1, 2, 3], RequestSpec(p))
    t_b = time.monotonic()
    e.add_request("b", [4, 5, 6], RequestSpec(p))
    seen: dict[str, list[float | None]] = {}
    a_done = None
    while e.has_unfinished():
        for o in e.step():
            seen.setdefault(o.request_id, []).append(o.queue_s)
            if o.request_id == "a" and o.finished:
                a_done = time.monotonic()
    assert [q is not None for q in seen["a"]] == [True, False, False]
    assert [q is not None for q in seen["b"]] == [True, False, False]
    # b could only start once a was done (max_batch 1): it queued at least that long.
    assert a_done is not None
    assert seen["b"][0] >= a_done - t_b - 1e-3
    assert seen["a"][0] < seen["b"][0]
