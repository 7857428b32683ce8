"""A request's state inside a worker."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from nitsum.engine.request_spec import CLASSES, RequestSpec
from nitsum.parallel.topology import GroupShape
from nitsum.sampling import SamplingParams
from nitsum.sampling_logprobs import TokenLogprob
from nitsum.structured.matcher import GrammarMatcher


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# Position of each class in that order (lower is served first).
CLASS_RANK = {c: i for i, c in enumerate(CLASSES)}


@dataclass(eq=False)
class Sequence:
    """Token ids, KV pages and progress of one request.

    NOTE (identity): two sequences are equal only if they are the same object, and a sequence
    hashes by identity. The scheduler's queues test membership (`in`, `remove`, `index`) every
    step for every running request; a field-by-field `__eq__` made that O(batch²) list
    compares of token lists (at batch 256, 4 M compares and 30 ms of host time a step).

    NOTE: `num_computed` tokens of `all_ids` have their K/V in `pages` under `layout`;
    the rest still need a forward pass. A decode step is just the case of one remaining token.
    """

    request_id: str
    prompt_ids: list[int]
    # What the request asked for (sampling, tier, class, priority, ...), as it arrived.
    spec: RequestSpec = field(default_factory=RequestSpec)
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    layout: GroupShape = field(default_factory=GroupShape)
    num_computed: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    # Structured output: where the output is in its grammar (None: unconstrained).
    grammar: GrammarMatcher | None = None
    arrival: float = field(default_factory=time.monotonic)
    # Monotonic time it was first scheduled (left the waiting queue); None: not yet.
    first_scheduled: float | None = None
    # Monotonic time by which the first token is due (arrival + the tier's TTFT); None: none.
    deadline: float | None = None
    # Host pages holding its first `num_computed` tokens' KV while it is swapped out.
    host_pages: list[int] = field(default_factory=list)
    # Running, but its KV is still being copied back from host: not scheduled until done.
    loading: bool = False
    # A sibling choice (n > 1) waits until this request's prompt is computed and shared
    # (engine/forks.py): not admitted while set.
    waits_for: str | None = None
    # Ids `min_tokens` masks until reached: EOS (unless ignore_eos) and the stop token ids.
    end_ids: tuple[int, ...] = ()
    # The last sampled token's logprobs when the request asked for them (runner.sample_batch).
    step_logprobs: TokenLogprob | None = None
    # With `sampling.prompt_logprobs`: entry j is prompt token j + 1's logprob, from the
    # logits at position j (runner.sample_batch; sent with the first output token).
    prompt_lps: list[TokenLogprob] = field(default_factory=list)
    # Prompt tokens its first admission found in the prefix cache (None: not admitted yet).
    cached_tokens: int | None = None

    # The local-scheduler class it is queued in now: the spec's, until the scheduler demotes
    # a request that missed its deadline to the last class.
    slo_class: str = field(init=False)

    def __post_init__(self) -> None:
        self.slo_class = self.spec.slo_class

    @property
    def sampling(self) -> SamplingParams:
        return self.spec.sampling

    @property
    def tier(self) -> str:
        return self.spec.tier

    @property
    def priority(self) -> int:
        """Within its class, lower is served first (vLLM's `priority` convention)."""
        return self.spec.priority

    @property
    def may_preempt(self) -> bool:
        """May preempt running sequences of a lower class or priority to get in."""
        return self.spec.may_preempt

    @property
    def scores_prompt(self) -> bool:
        """Whether some prompt logprobs are still to compute (then no prefix-cache reuse:
        every prompt position must run through the model)."""
        return (
            self.sampling.prompt_logprobs is not None
            and len(self.prompt_lps) < len(self.prompt_ids) - 1
        )

    def scored_positions(self, start: int, q_len: int) -> range:
        """Positions of a step over [start, start + q_len) whose logits give prompt logprobs
        not yet computed. NOTE: a recompute after preemption scores nothing twice."""
        if self.sampling.prompt_logprobs is None:
            return range(0)
        return range(max(start, len(self.prompt_lps)), min(start + q_len, len(self.prompt_ids) - 1))

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens whose K/V are not yet in the cache."""
        return self.total_len - self.num_computed

    @property
    def prefilled(self) -> bool:
        """Its whole prompt is in the cache."""
        return self.num_computed >= len(self.prompt_ids)

    @property
    def movable(self) -> bool:
        """Its KV can move to another group at this boundary: prefilled, a token sampled
        that is not in the cache yet (its next step is one token) and nothing being copied
        back from host."""
        return self.prefilled and not self.loading and self.remaining == 1

    def token_slice(self, start: int, n: int) -> list[int]:
        p = len(self.prompt_ids)
        if start + n <= p:
            return self.prompt_ids[start : start + n]
        if start >= p:  # NOTE: no copy of the prompt (a decode row asks this every step)
            return self.output_ids[start - p : start - p + n]
        return self.prompt_ids[start:] + self.output_ids[: start + n - p]
