"""Runs one step of the model under the active TP context and samples."""

from __future__ import annotations

from typing import Protocol

import torch

from nitsum.engine.graphs import DecodeGraphs
from nitsum.engine.piecewise import PiecewiseGraphs
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import StepInputs, build_step_inputs
from nitsum.kv.cache import KVCache
from nitsum.kv.host_tier import HostKVTier, PageCopies
from nitsum.kv.swap_copier import SwapCopier, SwapProgress
from nitsum.models.llama import LlamaModel
from nitsum.parallel.context import TPContext
from nitsum.sampling import sample
from nitsum.sampling_logprobs import token_logprobs
from nitsum.sampling_processors import RowContext, apply_processors
from nitsum.structured.mask import apply_grammars


class Runner(Protocol):
    """What an Engine needs of its runner (a ModelRunner on one device; a pool's GroupRunner
    on a TP group's devices)."""

    def prepare(self, batch: list[Scheduled]) -> StepInputs:
        """The model inputs of `batch` (and the group's mode for this step: TP or SP)."""
        ...

    def run(self, batch: list[Scheduled]) -> list[int]:
        """Forward `batch`; one sampled token per sampling entry, in batch order."""
        ...

    def start_swap(self, ticket: int, out: PageCopies, into: PageCopies) -> None:
        """Start copying (device page, host page) pairs `out` to host, then (host page, device
        page) pairs `into` back, on every device of the group, off the step path
        (kv/swap_copier.py); returns at once."""
        ...

    def swap_progress(self, wait_for: int | None = None) -> SwapProgress:
        """The group's swap progress (`SwapProgress`); with `wait_for`, once that ticket is
        done on every device."""
        ...


class ModelRunner:
    """Executes scheduled batches. `ctx` is swapped on a TP switch; nothing else changes."""

    def __init__(
        self,
        model: LlamaModel,
        pool: KVCache,
        ctx: TPContext,
        host: HostKVTier | None = None,
        graphs: DecodeGraphs | None = None,
        piecewise: PiecewiseGraphs | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.ctx = ctx
        self.copier = SwapCopier(host) if host is not None else None
        # The context's recorded decode steps (engine/graphs.py), built with it at start-up.
        self.graphs = graphs
        # Its steps recorded piecewise, all but attention (engine/piecewise.py): the steps
        # the decode recordings cannot run.
        self.piecewise = piecewise

    def prepare(self, batch: list[Scheduled]) -> StepInputs:
        return build_step_inputs(batch, self.pool.tokens_per_page(self.ctx.tp))

    def _recorded(self, inputs: StepInputs) -> DecodeGraphs | PiecewiseGraphs | None:
        """The recordings that run `inputs`: the whole-step decode ones, else the piecewise
        ones, else none (eager)."""
        for recorded in (self.graphs, self.piecewise):
            if recorded is not None and recorded.fits(inputs):
                return recorded
        return None

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Float32 logits of the sampled rows (identical on every rank of the group)."""
        recorded = self._recorded(inputs)
        if recorded is not None:
            return recorded.run(inputs)
        return self.model.logits(self.hidden(inputs))

    def join(self, inputs: StepInputs) -> None:
        """Run a step on a rank that does not sample: its collectives, not its logits (a
        recorded step holds both, and every rank of the group must replay the same one)."""
        recorded = self._recorded(inputs)
        if recorded is not None:
            recorded.run(inputs)
        else:
            self.hidden(inputs)

    def hidden(self, inputs: StepInputs) -> torch.Tensor:
        """The step's last hidden states of the sampled rows (a rank that is not its group's
        leader needs only these: its collectives are in the forward, the logits are the
        leader's). A pipeline stage runs the micro-batches in order; only the last stage's
        rows are the step's (the others return none)."""
        device = self.model.weights.embed.device
        parts = [
            self.model.forward(
                self.ctx,
                part.input_ids.to(device),
                part.positions.to(device),
                part.meta.to(device),
                self.pool,
                part.sample_rows,
                part.sequence_parallel,
            )
            for part in inputs.parts
        ]
        if self.ctx.stage is not None:
            self.ctx.stage.finish()
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def run(self, batch: list[Scheduled]) -> list[int]:
        """Forward the batch and return one sampled token per sampling sequence."""
        return sample_batch(self.forward(self.prepare(batch)), batch)

    def start_swap(self, ticket: int, out: PageCopies, into: PageCopies) -> None:
        self._copier().start(ticket, out, into)

    def swap_progress(self, wait_for: int | None = None) -> SwapProgress:
        return self._copier().progress(wait_for)

    def _copier(self) -> SwapCopier:
        if self.copier is None:
            raise RuntimeError("this device has no host KV tier")
        return self.copier


def penalty_context(seq: Sequence) -> RowContext:
    """What the processors of `seq` read. NOTE: a resumed request's prompt ends with the
    output streamed before the resume (`resumed_tokens`); its penalties count that as output,
    as they did on the worker that generated it."""
    k = seq.sampling.resumed_tokens
    if k == 0:  # the common case: no copies
        return RowContext(seq.prompt_ids, seq.output_ids, seq.end_ids)
    cut = len(seq.prompt_ids) - k
    return RowContext(seq.prompt_ids[:cut], seq.output_ids, seq.end_ids, seq.prompt_ids[cut:])


def score_prompts(logits: torch.Tensor, batch: list[Scheduled]) -> torch.Tensor:
    """Take the prompt-scoring rows out of `logits` (the step's rows, laid out as
    `build_step_inputs` does): each scored position's next prompt token's logprob goes to its
    sequence's `prompt_lps`. Returns the sampled rows."""
    sampled: list[int] = []
    row = 0
    for item in batch:
        seq = item.seq
        positions = seq.scored_positions(item.start, item.q_len)
        if positions:
            n = len(positions)
            targets = [seq.prompt_ids[p + 1] for p in positions]
            params = [seq.sampling] * n
            lps = token_logprobs(logits[row : row + n], targets, params, "prompt_logprobs")
            seq.prompt_lps.extend(lp for lp in lps if lp is not None)
            row += n
        if item.sample:
            sampled.append(row)
            row += 1
    return logits if row == len(sampled) else logits[sampled]


def sample_batch(logits: torch.Tensor, batch: list[Scheduled]) -> list[int]:
    """Sample the rows of `logits` for the entries of `batch` that sample, in order; a
    sequence that asked for logprobs gets them in `seq.step_logprobs` (and its prompt's in
    `seq.prompt_lps`, from the scoring rows before its sampled one)."""
    logits = score_prompts(logits, batch)
    seqs = [s.seq for s in batch if s.sample]
    params = [s.sampling for s in seqs]
    # NOTE: the one hook for logit processors and grammars: sampling and logprobs both see
    # their output. Processors first, then each grammar's mask (a token the grammar forbids
    # has logprob -inf, as in vLLM, whatever a bias or penalty did to it).
    contexts = [penalty_context(s) for s in seqs]
    logits = apply_processors(logits, params, contexts)
    logits = apply_grammars(logits, [s.grammar for s in seqs])
    tokens = sample(logits, params, [s.generator for s in seqs])
    for seq, lp in zip(seqs, token_logprobs(logits, tokens, params), strict=True):
        seq.step_logprobs = lp
    return tokens
