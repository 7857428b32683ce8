"""Overlapped steps (engine/overlap.py) give the synchronous engine's tokens and finish
reasons, and really prepare step N+1 before step N's tokens are applied."""

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.overlap import PENDING, LaunchFailed, OverlapStepper, overlap_wanted
from nitsum.engine.request_spec import RequestSpec
from nitsum.sampling import SAMPLE_FAILED, SamplingParams, sample_on_device
from tiny import kv_bytes, make_tiny, random_prompt, run_arrivals, run_to_completion


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def engine(tiny, overlap: bool, eos: tuple[int, ...] = (), pages: int = 256, **kw):
    hf, cfg = tiny
    per_page = 2 * cfg.num_layers * 4 * cfg.num_kv_heads * cfg.head_dim * 4
    ecfg = EngineConfig(kv_cache_bytes=per_page * pages, page_tokens=4, overlap=overlap, **kw)
    e = build_engine(cfg, hf.state_dict().items(), ecfg, eos_token_ids=eos)
    assert isinstance(e.driver, OverlapStepper) == overlap
    return e


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kw)


def both(tiny, requests, eos=(), **kw):
    """Run `requests` ((id, prompt, params)) to completion on a synchronous and an
    overlapped engine; both results, and the overlapped engine."""
    results = []
    for overlap in (False, True):
        e = engine(tiny, overlap, eos, **kw)
        for rid, prompt, params in requests:
            e.add_request(rid, prompt, RequestSpec(params))
        results.append(run_to_completion(e))
        assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages
    return results[0], results[1], e


def test_requests_ending_at_different_steps_equal_the_synchronous_engine(tiny):
    _, cfg = tiny
    reqs = [
        (f"r{i}", random_prompt(cfg, 3 + 5 * i, i), greedy(m, ignore_eos=True))
        for i, m in enumerate([1, 2, 5, 9, 14])
    ]
    sync, over, e = both(tiny, reqs, token_budget=16)
    assert over == sync
    assert {rid: len(ids) for rid, ids in over[0].items()} == {
        "r0": 1,
        "r1": 2,
        "r2": 5,
        "r3": 9,
        "r4": 14,
    }
    assert e.driver.launches > 0 and e.driver.sync_steps == 0


def test_an_eos_ending_a_request_early_equals_the_synchronous_engine(tiny):
    _, cfg = tiny
    prompts = [random_prompt(cfg, 6 + 3 * i, 10 + i) for i in range(4)]
    probe = engine(tiny, False)
    probe.add_request("p", prompts[1], RequestSpec(greedy(12, ignore_eos=True)))
    eos = run_to_completion(probe)[0]["p"][3]  # a token the model does produce
    # NOTE: EOS rides in the stop ids (the router adds it); the engine adds none.
    reqs = [(f"r{i}", p, greedy(12, stop_token_ids=(eos,))) for i, p in enumerate(prompts)]
    sync, over, _ = both(tiny, reqs, eos=(eos,))
    assert over == sync
    assert over[1]["r1"] == "stop" and len(over[0]["r1"]) <= 4
    assert "length" in over[1].values()


def test_a_request_ended_by_eos_keeps_its_pages_until_its_wasted_step_is_done(tiny):
    _, cfg = tiny
    prompt = random_prompt(cfg, 9, 4)
    probe = engine(tiny, False)
    probe.add_request("p", prompt, RequestSpec(greedy(8, ignore_eos=True)))
    eos = run_to_completion(probe)[0]["p"][2]
    e = engine(tiny, True, eos=(eos,))
    e.add_request("a", prompt, RequestSpec(greedy(8, stop_token_ids=(eos,))))
    e.add_request("b", random_prompt(cfg, 5, 5), RequestSpec(greedy(8, ignore_eos=True)))
    stepper: OverlapStepper = e.driver
    for _ in range(10):
        outs = e.step()
        if any(o.request_id == "a" and o.finished for o in outs):
            break
    seq = next(s for s in stepper.inflight.finished_inside if s.request_id == "a")
    assert seq.finish_reason == "stop" and seq.output_ids[-1] == eos and seq.pages
    held = set(seq.pages)
    assert held <= e.scheduler.pages.alloc.used(0)  # not free: nobody else gets them
    e.step()  # the step "a" was wasted in is applied: its pages are back
    assert not seq.pages
    run_to_completion(e)
    assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages


def test_a_long_prompt_chunked_while_others_decode_equals_the_synchronous_engine(tiny):
    _, cfg = tiny
    results = []
    for overlap in (False, True):
        e = engine(tiny, overlap, token_budget=12)
        e.add_request("a", random_prompt(cfg, 5, 1), RequestSpec(greedy(20, ignore_eos=True)))
        e.add_request("b", random_prompt(cfg, 7, 2), RequestSpec(greedy(16, ignore_eos=True)))
        early = [o for _ in range(4) for o in e.step()]
        e.add_request("long", random_prompt(cfg, 90, 3), RequestSpec(greedy(6, ignore_eos=True)))
        outs, reasons = run_to_completion(e)
        for o in reversed(early):
            outs[o.request_id][:0] = o.new_token_ids
        results.append((outs, reasons))
    assert results[1] == results[0]
    assert len(results[1][0]["long"]) == 6


def test_an_abort_mid_run_spares_the_others_and_frees_its_pages(tiny):
    _, cfg = tiny
    reqs = [
        (f"r{i}", random_prompt(cfg, 4 + 6 * i, 20 + i), greedy(10, ignore_eos=True))
        for i in range(3)
    ]
    sync, _, _ = both(tiny, reqs)
    e = engine(tiny, True)
    for rid, prompt, params in reqs:
        e.add_request(rid, prompt, RequestSpec(params))
    early = [o for _ in range(3) for o in e.step()]
    assert any(s.request_id == "r1" for s, _ in e.driver.inflight.sampled)  # in flight
    assert e.abort("r1") and not e.abort("r1")
    outs, reasons = run_to_completion(e)
    for o in reversed(early):
        if o.request_id != "r1":
            outs[o.request_id][:0] = o.new_token_ids
    assert "r1" not in outs and "r1" not in reasons
    assert outs == {r: sync[0][r] for r in ("r0", "r2")}
    assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages


def test_preemption_under_a_small_kv_pool_equals_the_synchronous_engine(tiny):
    _, cfg = tiny
    reqs = [
        (f"r{i}", random_prompt(cfg, 5 + 7 * i, 30 + i), greedy(12, ignore_eos=True))
        for i in range(6)
    ]
    sync, over, e = both(tiny, reqs, pages=20)
    assert over == sync
    assert e.scheduler.preemptions > 0
    full, _, _ = both(tiny, reqs)
    assert over == full


def test_step_n_plus_1_is_launched_before_step_n_tokens_are_applied(tiny):
    _, cfg = tiny
    e = engine(tiny, True)
    log: list[str] = []
    forward, apply_token = e.runner.forward, e.apply_token
    e.runner.forward = lambda inputs: (log.append("forward"), forward(inputs))[1]
    e.apply_token = lambda seq, token: (log.append("apply"), apply_token(seq, token))[1]
    e.add_request("a", random_prompt(cfg, 6, 7), RequestSpec(greedy(3, ignore_eos=True)))
    assert e.step() == [] and log == ["forward"]  # step 0 launched, nothing read back
    out = e.step()
    assert [o.new_token_ids != [PENDING] for o in out] == [True]
    assert log == ["forward", "forward", "apply"]  # step 1 launched, then step 0 applied
    assert list(e.driver.events) == [("launch", 0), ("launch", 1), ("apply", 0)]
    seq = e.seqs["a"]
    assert seq.output_ids[-1] == PENDING and seq.output_ids[0] == out[0].new_token_ids[0]
    assert e.step()[0].finish_reason is None  # step 2 launched, step 1 applied
    # Step 2's token surely ends "a" (max_tokens): no step 3 is launched before applying it.
    out = e.step()
    assert out[0].finish_reason == "length" and len(seq.output_ids) == 3
    assert log == ["forward", "forward", "apply", "forward", "apply", "apply"]
    assert list(e.driver.events)[-3:] == [("launch", 2), ("apply", 1), ("apply", 2)]
    assert not e.has_unfinished()


def test_a_batch_needing_host_tokens_runs_synchronously_and_equal(tiny):
    _, cfg = tiny
    reqs = [
        ("plain", random_prompt(cfg, 8, 40), greedy(9, ignore_eos=True)),
        ("lp", random_prompt(cfg, 5, 41), greedy(6, ignore_eos=True, logprobs=2)),
        ("pen", random_prompt(cfg, 6, 42), greedy(7, ignore_eos=True, repetition_penalty=1.5)),
        (
            "topk1",
            random_prompt(cfg, 7, 43),
            SamplingParams(max_tokens=8, top_k=1, ignore_eos=True),
        ),
    ]
    sync, over, e = both(tiny, reqs)
    assert over == sync
    assert e.driver.sync_steps > 0 and e.driver.launches > 0


def test_a_top_k_1_random_request_overlaps_and_equals_greedy(tiny):
    _, cfg = tiny
    prompt = random_prompt(cfg, 7, 50)
    sync, over, e = both(
        tiny, [("r", prompt, SamplingParams(max_tokens=8, top_k=1, ignore_eos=True))]
    )
    ref, _, _ = both(tiny, [("r", prompt, greedy(8, ignore_eos=True))])
    assert over == sync and over[0] == ref[0]
    assert e.driver.sync_steps == 0


def test_the_device_sampler_takes_argmax_top_k_and_flags_bad_rows():
    logits = torch.zeros(4, 16)
    logits[0, 5] = 9.0
    logits[1] = float("nan")
    logits[2, 7] = 3.0
    logits[3, 11] = 2.0
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.5, top_p=0.01),
    ]
    assert sample_on_device(logits, params).tolist() == [5, SAMPLE_FAILED, 7, 11]
    # A plain random row draws by the distribution: a two-token tie comes out both ways.
    tie = torch.full((400, 4), -30.0)
    tie[:, 1] = tie[:, 2] = 0.0
    drawn = sample_on_device(tie, [SamplingParams(temperature=1.0)] * 400)
    counts = torch.bincount(drawn, minlength=4).tolist()
    assert counts[0] == counts[3] == 0 and 120 < counts[1] < 280


def test_overlap_is_on_by_default_on_cuda_only(monkeypatch):
    monkeypatch.delenv("NITSUM_OVERLAP", raising=False)
    assert overlap_wanted("cuda:0") and not overlap_wanted("cpu")
    assert not overlap_wanted("cuda", configured=False) and overlap_wanted("cpu", True)
    monkeypatch.setenv("NITSUM_OVERLAP", "1")
    assert overlap_wanted("cpu")
    monkeypatch.setenv("NITSUM_OVERLAP", "0")
    assert not overlap_wanted("cuda:0")


@pytest.mark.parametrize("graphs", [False, True])
def test_a_one_device_pool_engine_overlaps_and_equals_the_synchronous_one(tiny, graphs):
    """The LLM / one-device worker path, with and without recorded decode steps (on the CPU
    the same static buffers, run eagerly)."""
    from nitsum.pool.local import ONLY_GROUP, local_engine

    hf, cfg = tiny
    reqs = [(f"r{i}", random_prompt(cfg, 4 + 9 * i, 60 + i), greedy(3 + 4 * i)) for i in range(4)]
    results = []
    for overlap in (False, True):
        ecfg = EngineConfig(
            kv_cache_bytes=1 << 20,
            page_tokens=4,
            token_budget=16,
            overlap=overlap,
            decode_graphs=graphs,
        )
        pe = local_engine(cfg, hf.state_dict().items(), ecfg)
        for rid, prompt, params in reqs:
            pe.add_request(rid, prompt, RequestSpec(params))
        results.append(run_to_completion(pe))
        driver = pe.engines[ONLY_GROUP].driver
        assert (driver is not None and driver.launches > 0) == overlap
        if graphs:
            assert pe.pool.runner.graphs.replays > 0
    assert results[1] == results[0]


def test_a_swapped_out_request_comes_back_unchanged_under_overlap(tiny):
    _, cfg = tiny
    long = greedy(24, ignore_eos=True)
    results = []
    for overlap in (False, True):
        e = build_engine(
            cfg,
            tiny[0].state_dict().items(),
            EngineConfig(
                kv_cache_bytes=kv_bytes(cfg, 64),
                host_kv_cache_bytes=kv_bytes(cfg, 32),
                page_tokens=4,
                token_budget=64,
                max_batch=2,
                overlap=overlap,
            ),
        )
        e.scheduler.swap.bytes_per_s = 1e15  # copies cost nothing: always swap
        ps = {r: random_prompt(cfg, 30 + i, i) for i, r in enumerate(("bg0", "bg1", "strict"))}
        bg_spec = RequestSpec(long, slo_class="background", tier="background")
        bg = [(r, ps[r], bg_spec) for r in ("bg0", "bg1")]
        strict = [("strict", ps["strict"], RequestSpec(long, slo_class="feasible", tier="s"))]
        out, _ = run_arrivals(e, {0: bg, 12: strict})
        c = e.counters()
        assert c["num_preemptions_swap"] >= 1
        assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages
        assert e.scheduler.swap.host.num_free == e.scheduler.swap.host.num_pages
        results.append(out)
    assert results[1] == results[0]


@pytest.mark.parametrize("seed", range(10))
def test_random_arrivals_aborts_and_preemption_equal_the_synchronous_engine(tiny, seed):
    """Requests arrive and are aborted at random steps on a small pool (preemption, chunked
    prompts, EOS, now and then one with logprobs): every request not aborted gets the
    synchronous engine's tokens and reason."""
    _, cfg = tiny
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    prompts = [random_prompt(cfg, rand(2, 40), 100 * seed + i) for i in range(8)]
    probe = engine(tiny, False)
    for i, prompt in enumerate(prompts):
        probe.add_request(f"p{i}", prompt, RequestSpec(greedy(14, ignore_eos=True)))
    made = [t for ids in run_to_completion(probe)[0].values() for t in ids]
    eos = max(set(made), key=made.count)  # the model's favourite token: some requests stop
    arrivals: dict[int, list] = {}
    for i, prompt in enumerate(prompts):
        # Some need their tokens on the host: steps go synchronous and back while they run.
        host = {"logprobs": 1} if rand(0, 4) == 0 else {}
        params = greedy(rand(1, 14), ignore_eos=bool(rand(0, 3) == 0), **host)
        arrivals.setdefault(rand(0, 8), []).append((f"r{i}", prompt, params))
    aborts = {rand(2, 12): f"r{rand(0, 8)}" for _ in range(3)}
    results = []
    for overlap in (False, True):
        e = engine(tiny, overlap, eos=(eos,), pages=18, token_budget=12, max_batch=4)
        outs: dict[str, list[int]] = {}
        reasons: dict[str, str] = {}
        gone: set[str] = set()
        step = 0
        while e.has_unfinished() or step <= max(arrivals):
            for rid, prompt, params in arrivals.get(step, []):
                e.add_request(rid, prompt, RequestSpec(params))
            if step in aborts and e.abort(aborts[step]):
                gone.add(aborts[step])
            for o in e.step():
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finished:
                    reasons[o.request_id] = o.finish_reason
            step += 1
            assert step < 500
        assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages
        results.append((outs, reasons, gone))
    (sync, sync_reasons, _), (over, over_reasons, gone) = results
    kept = {r for r in sync_reasons if r not in gone and r not in results[0][2]}
    assert kept, "every request was aborted"
    assert {r: over[r] for r in kept} == {r: sync[r] for r in kept}
    assert {r: over_reasons[r] for r in kept} == {r: sync_reasons[r] for r in kept}
    assert set(over_reasons) | gone == {f"r{i}" for i in range(8)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_host_returns_while_the_launched_step_still_runs(tiny):
    """On CUDA the mode is on by default; a step slowed down on the device (a spin kernel in
    its forward) is still running when `step` returns, and the tokens equal the synchronous
    engine's (with recorded decode steps, the production path)."""
    from nitsum.pool.local import ONLY_GROUP, local_engine

    hf, cfg = tiny
    reqs = [(f"r{i}", random_prompt(cfg, 5 + 6 * i, 70 + i), greedy(4 + 3 * i)) for i in range(4)]
    results, engines = [], []
    for overlap in (None, False):
        ecfg = EngineConfig(device="cuda", kv_cache_bytes=1 << 20, page_tokens=4, overlap=overlap)
        pe = local_engine(cfg, hf.state_dict().items(), ecfg)
        for rid, prompt, params in reqs:
            pe.add_request(rid, prompt, RequestSpec(params))
        results.append(run_to_completion(pe))
        engines.append(pe)
    assert results[0] == results[1]
    engine = engines[0].engines[ONLY_GROUP]
    stepper = engine.driver
    assert isinstance(stepper, OverlapStepper) and stepper.sync_steps == 0
    runner = engines[0].pool.runner
    forward = runner.forward
    runner.forward = lambda inputs: (torch.cuda._sleep(200_000_000), forward(inputs))[1]
    engines[0].add_request("slow", random_prompt(cfg, 6, 80), RequestSpec(greedy(6)))
    engines[0].step()
    engines[0].step()
    assert stepper.inflight is not None and not stepper.inflight.done.query()
    run_to_completion(engines[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_launching_a_step_never_waits_for_the_device(tiny, monkeypatch):
    """Every launch of an overlapped step (scheduling done: inputs, forward, sampling and the
    token copy) runs under CUDA's sync debug mode "error": any op that makes the host wait
    for the device (a pageable copy, indexing with a list, `.item()`) raises. Mixed steps
    (prefill chunks beside decode rows: the piecewise recordings and the Triton prefill
    kernel), pure decode steps (the whole-step recordings), greedy and random rows."""
    from nitsum.pool.local import ONLY_GROUP, local_engine

    hf, cfg = tiny
    ecfg = EngineConfig(device="cuda", kv_cache_bytes=1 << 20, page_tokens=4, token_budget=24)
    pe = local_engine(cfg, hf.state_dict().items(), ecfg)
    stepper = pe.engines[ONLY_GROUP].driver
    assert isinstance(stepper, OverlapStepper)
    launch, launched = stepper._launch, []

    def strict(batch, prev):
        torch.cuda.set_sync_debug_mode("error")
        try:
            run = launch(batch, prev)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        launched.append(sorted(item.q_len for item in batch))
        return run

    monkeypatch.setattr(stepper, "_launch", strict)
    for i in range(6):
        params = greedy(6 + i) if i % 2 else SamplingParams(max_tokens=6 + i, temperature=0.8)
        pe.add_request(f"r{i}", random_prompt(cfg, 9 + 7 * i, 200 + i), RequestSpec(params))
    run_to_completion(pe)
    assert stepper.sync_steps == 0
    assert any(qs[-1] > 1 and qs[0] == 1 for qs in launched), launched  # a mixed step
    assert any(qs[-1] == 1 for qs in launched), launched  # a decode-only step


def test_a_failed_launch_still_hands_over_the_step_before(tiny):
    _, cfg = tiny
    prompt = random_prompt(cfg, 6, 90)
    sync, _, _ = both(tiny, [("x", prompt, greedy(5))])
    e = engine(tiny, True)
    forward, calls = e.runner.forward, []

    def flaky(inputs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return forward(inputs)

    e.runner.forward = flaky
    e.add_request("x", prompt, RequestSpec(greedy(5)))
    assert e.step() == []
    with pytest.raises(LaunchFailed) as failed:
        e.step()
    assert str(failed.value.__cause__) == "boom"
    assert [o.new_token_ids for o in failed.value.outputs] == [sync[0]["x"][:1]]
    assert e.seqs["x"].output_ids == sync[0]["x"][:1]  # no placeholder left behind
    assert e.abort("x")
    assert e.scheduler.num_reclaimable() == e.scheduler.pages.num_pages
