"""The worker engine: add requests, step, stream outputs, abort."""

from __future__ import annotations

import logging
import time

from nitsum.config import ModelConfig
from nitsum.engine.forks import Forks
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.runner import Runner
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.scheduler import Scheduler
from nitsum.engine.sequence import CLASSES, Sequence, Status
from nitsum.engine.step_driver import StepDriver
from nitsum.engine.step_log import EngineStepLog
from nitsum.engine.swap import COUNTERS as SWAP_COUNTERS
from nitsum.engine.validation import validate_request
from nitsum.errors import InvalidRequestError
from nitsum.kv.pages import GroupPages
from nitsum.parallel.topology import GroupShape
from nitsum.sampling import SAMPLE_FAILED, make_generator
from nitsum.structured.start import grammar_finish, start_grammar

log = logging.getLogger(__name__)


class Engine:
    """Continuous-batching engine over one TP group's runner (the leader drives it).

    NOTE: the scheduler's queues are the engine's own: callers above it (the pool, the
    worker, the profiler) go through the methods below, never through `scheduler`.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        runner: Runner,
        scheduler: Scheduler,
        max_context: int | None = None,
        eos_token_ids: tuple[int, ...] | None = None,
    ) -> None:
        self.cfg = cfg
        self.runner = runner
        self.scheduler = scheduler
        self.max_context = min(
            max_context or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        self.eos_token_ids = set(eos_token_ids if eos_token_ids is not None else cfg.eos_token_ids)
        pages = scheduler.pages
        # The group the engine runs on: its sequences' KV layout.
        self.shape = GroupShape.pipeline(tuple(pages.members), pages.tp)
        self.seqs: dict[str, Sequence] = {}
        self.forks = Forks(scheduler.kv)
        if scheduler.swap is not None:
            scheduler.swap.copier = runner  # the group's copy threads run its swaps
        # Runs `step` instead of the synchronous path when set (engine/overlap.py).
        self.driver: StepDriver | None = None
        # `NITSUM_STEP_LOG`: a line per step (engine/step_log.py).
        self.step_log = EngineStepLog.from_env()

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], spec: RequestSpec) -> None:
        """Validate and queue a request; raises InvalidRequestError and changes nothing else.

        `spec.fork_of`: the request of the first of n > 1 choices of the same prompt, whose
        prefill this one shares when it is here (engine/forks.py). `spec.ttft_ms`: the
        tier's TTFT target; a request not started within it is served last. `spec.priority`:
        lower is served first within its class; with `spec.may_preempt` it preempts running
        requests of a lower class or priority when it cannot get in otherwise.
        """
        if request_id in self.seqs:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        sampling = spec.sampling
        validate_request(
            prompt_ids, sampling, self.cfg.vocab_size, self.max_context, self.scheduler.pages
        )
        grammar = start_grammar(sampling.grammar, prompt_ids)
        seq = Sequence(request_id, list(prompt_ids), spec)
        if spec.ttft_ms is not None:
            seq.deadline = seq.arrival + spec.ttft_ms / 1000.0
        seq.generator = make_generator(sampling)
        # NOTE: the stop ids hold the model's EOS already: the router adds them (api/prepare.rs),
        # the in-process LLM API too (llm.py); the engine adds nothing.
        seq.end_ids = sampling.stop_token_ids
        seq.grammar = grammar
        seq.layout = self.shape
        self.seqs[request_id] = seq
        fork_of = spec.fork_of
        self.forks.join(seq, self.seqs.get(fork_of) if fork_of is not None else None)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its pages; False if it is unknown or already finished."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        if self.driver is not None:
            self.driver.settle()  # NOTE: no page is freed while a step in flight writes it
        self.scheduler.remove(request_id)
        self.forks.release(request_id)
        seq.status, seq.finish_reason = Status.FINISHED, "abort"
        return True

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    # -- what the group holds ------------------------------------------------------------------
    @property
    def pages(self) -> GroupPages:
        """The group's pages (a sequence moving in gets its pages from here)."""
        return self.scheduler.pages

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @max_batch.setter
    def max_batch(self, n: int) -> None:
        self.scheduler.max_batch = n

    def admit_only(self, request_ids: set[str] | None) -> None:
        """Start only these requests from now on (None: any); running ones go on."""
        self.scheduler.admit_only = request_ids

    def settle_swaps(self) -> None:
        """Finish every swap copy in flight (before other groups use the same devices)."""
        if self.scheduler.swap is not None:
            self.scheduler.swap.settle()

    def request_ids(self) -> list[str]:
        """Every request the engine holds, waiting or running."""
        return list(self.seqs)

    def running(self) -> list[Sequence]:
        """The running sequences, in batch order."""
        return list(self.scheduler.running)

    def sequences(self) -> list[Sequence]:
        """Every sequence: the running ones first, then the waiting ones class by class."""
        return self.running() + [s for c in CLASSES for s in self.scheduler.waiting[c]]

    def load(self) -> tuple[int, int, int]:
        """(running, waiting, free pages), for heartbeats."""
        s = self.scheduler
        return len(s.running), s.num_waiting(), s.num_reclaimable()

    # -- sequences moving between groups (pool/kv_move.py) --------------------------------------
    def detach(self, seq: Sequence, free: bool = True) -> None:
        """Give `seq` up (its KV was copied to another group): forget it, free its pages
        (without `free`: later, `free_pages`; a NIXL peer reads them meanwhile)."""
        self.scheduler.detach(seq)
        self.forks.release(seq.request_id)
        self.seqs.pop(seq.request_id, None)
        if free:
            self.free_pages(seq)

    def free_pages(self, seq: Sequence) -> None:
        self.scheduler.kv.free(seq)

    def cached_pages(self) -> set[int]:
        """Pages the group's prefix cache holds (besides those its sequences own)."""
        cache = self.scheduler.cache
        return cache.pages() if cache is not None else set()

    def num_evictable(self) -> int:
        """Cached pages no sequence uses: free as soon as a sequence needs them."""
        cache = self.scheduler.cache
        return cache.num_evictable if cache is not None else 0

    def flush_prefix_cache(self) -> int:
        """Drop the cached prefix pages no sequence uses; returns the device pages freed."""
        return self.scheduler.kv.flush()

    def num_host_cached(self) -> int:
        """Host pages holding cached prefix pages (free as soon as a swap needs them)."""
        cache = self.scheduler.cache
        return cache.num_host if cache is not None else 0

    def counters(self) -> dict[str, int]:
        """Cumulative: prompt tokens looked up in / found in the prefix cache
        (`prefix_cache_queries` / `_hits`, of the hits those loaded back from the host tier
        `prefix_cache_host_hits`), preemptions (`num_preemptions`, of which by swap
        `num_preemptions_swap`) and the host tier's traffic (`swap_*`: pages out and in,
        bytes and copies done, steps that waited for a copy)."""
        cache, swap = self.scheduler.cache, self.scheduler.swap
        return {
            "prefix_cache_queries": cache.queries if cache is not None else 0,
            "prefix_cache_hits": cache.hits if cache is not None else 0,
            "prefix_cache_host_hits": cache.host_hits if cache is not None else 0,
            "num_preemptions": self.scheduler.preemptions,
            "num_preemptions_swap": self.scheduler.swapped,
            **(swap.counters if swap is not None else dict.fromkeys(SWAP_COUNTERS, 0)),
        }

    def close(self) -> None:
        """The group is dissolved: its idle cached pages go back to the allocator."""
        self.scheduler.kv.close()

    def reclaim(self, pages: int) -> None:
        """Free `pages` pages of the group if idle cached ones allow (before a KV move in)."""
        self.scheduler.kv.reclaim(pages)

    def adopt(self, seq: Sequence) -> None:
        """Take `seq` over from another group; its pages and layout are already ours."""
        self.seqs[seq.request_id] = seq
        self.scheduler.adopt(seq)

    def forget(self, request_id: str) -> None:
        """Never step `request_id` again, whatever state it is in (after a failed abort)."""
        self.seqs.pop(request_id, None)

    def abort_or_forget(self, request_id: str) -> bool:
        """`abort`, and if even that fails (the engine is upset), `forget`: a request taken
        out is never stepped again either way."""
        try:
            return self.abort(request_id)
        except Exception:
            log.exception("abort(%r) failed", request_id)
            self.forget(request_id)
            return True

    # -- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns the new tokens of every sequence that sampled."""
        if self.driver is not None:
            if self.step_log is None:
                return self.driver.step()
            return self.step_log.driven(self.driver, self.scheduler)
        started = time.monotonic()
        batch = self.begin_step()
        if not batch:
            return []
        tokens = self.runner.run(batch)
        return self.end_step(batch, tokens, time.monotonic() - started)

    def begin_step(self) -> list[Scheduled]:
        """The next step's batch (empty: nothing to do). A caller that runs the forward
        itself (a pool running groups concurrently) ends the step with `end_step`.

        Swaps (engine/swap.py): the copies that finished let their sequences join this batch;
        the copies this batch planned start before its forward, which waits for them only if
        a swap-in of this batch is synchronous.
        """
        swap = self.scheduler.swap
        if swap is not None:
            swap.poll()
        batch = self.scheduler.schedule()
        if self.step_log is not None:
            self.step_log.scheduled = batch
        if swap is not None:
            swap.submit()
            if not batch:
                swap.wait_loading()  # nothing runs until a swap-in is done: no busy loop
        return batch

    def end_step(
        self, batch: list[Scheduled], tokens: list[int], seconds: float
    ) -> list[RequestOutput]:
        """End a step `begin_step` began: its sampled tokens and how long it took."""
        ended = time.perf_counter()
        self.scheduler.step_done(batch, seconds)
        outputs = self.complete_step(batch, tokens)
        if self.step_log is not None:
            waited = self.driver.waited_s if self.driver is not None else 0.0
            self.step_log.record(ended - seconds, ended, batch, self.scheduler, waited)
        return outputs

    def complete_step(self, batch: list[Scheduled], tokens: list[int]) -> list[RequestOutput]:
        """Apply a step's sampled tokens (one per sampling entry of `batch`, in order)."""
        outputs = []
        sampled = iter(tokens)
        for item in batch:
            seq = item.seq
            seq.num_computed = item.start + item.q_len
            self.forks.computed(seq)
            if item.sample:
                outputs.append(self.apply_token(seq, next(sampled)))
        return outputs

    def apply_token(self, seq: Sequence, token: int) -> RequestOutput:
        """Append `seq`'s sampled `token`; end the request if it ends there."""
        if token == SAMPLE_FAILED:
            self._finish(seq, "error")
            return RequestOutput(seq.request_id, [], "error")
        seq.output_ids.append(token)
        reason = self._finish_reason(seq, token)
        error = None
        if reason is None and seq.grammar is not None:
            reason, error = grammar_finish(seq.grammar, token)
        if reason is not None:
            self._finish(seq, reason)
        lp, seq.step_logprobs = seq.step_logprobs, None
        logprobs = None if lp is None else [lp]
        out = RequestOutput(seq.request_id, [token], reason, error, logprobs=logprobs)
        if len(seq.output_ids) == 1 and seq.first_scheduled is not None:
            out.queue_s = max(0.0, seq.first_scheduled - seq.arrival)
        if len(seq.output_ids) == 1:
            out.cached_tokens = seq.cached_tokens or 0
        if len(seq.output_ids) == 1 and seq.sampling.prompt_logprobs is not None:
            out.prompt_logprobs = list(seq.prompt_lps)
        return out

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.sampling
        if token in p.stop_token_ids:
            return "stop"
        if len(seq.output_ids) >= p.max_tokens or seq.total_len >= self.max_context:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.forks.release(seq.request_id)
        self.scheduler.remove(seq.request_id)
        self.seqs.pop(seq.request_id, None)
        seq.status, seq.finish_reason = Status.FINISHED, reason
