"""The offline Python API: `LLM(model).generate(prompts, sampling)` and `LLM.chat(...)`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.load import resolve_model_dir
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.local import open_local_engine
from nitsum.sampling import SamplingParams
from nitsum.tokenizer import Tokenizer

Prompt = str | list[int]
Message = dict[str, str]


def _batch_of(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text, or token ids) as a batch of one; a batch as it is."""
    if isinstance(prompts, str):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [cast(list[int], list(prompts))]
    return cast(list[Prompt], list(prompts))


@dataclass
class Completion:
    """One finished request."""

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_token_ids: list[int]


class LLM:
    """A one-device pool engine (the engine path of `nitsum serve` too) over a model name
    ("default" = the embedded SmolLM2), an HF directory or a GGUF file."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        dtype: str = "float32",
        kv_cache_mb: int = 512,
        max_batch: int | None = None,
        token_budget: int | None = None,
        max_context: int | None = None,
        device: str = "cpu",
    ) -> None:
        self.model_dir = resolve_model_dir(model)
        ecfg = EngineConfig(
            dtype=getattr(torch, dtype),
            device=device,
            kv_cache_bytes=kv_cache_mb << 20,
            max_context=max_context,
        )  # NOTE: the device's step limits (EngineConfig) unless given here
        if max_batch is not None:
            ecfg.max_batch = max_batch
        if token_budget is not None:
            ecfg.token_budget = token_budget
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.engine = open_local_engine(self.model_dir, ecfg)
        eos = self.engine.eos
        # The model's EOS ids: every request stops on them unless `ignore_eos` (the router
        # adds them to a served request's stop ids; here nobody else does).
        self.eos_token_ids = tuple(eos if eos is not None else self.engine.cfg.eos_token_ids)
        self._next_id = 0

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Run every prompt (text or token ids) to completion, batched continuously."""
        prompts = _batch_of(prompts)
        params = (
            sampling
            if isinstance(sampling, list)
            else [sampling or SamplingParams()] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError("need one SamplingParams per prompt")
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        request_ids = []
        for prompt_ids, p in zip(ids, params, strict=True):
            p.validate()  # NOTE: the values' one check here (the router checks served ones)
            if not p.ignore_eos:
                eos = tuple(t for t in self.eos_token_ids if t not in p.stop_token_ids)
                p = replace(p, stop_token_ids=p.stop_token_ids + eos)
            request_ids.append(f"llm-{self._next_id}")
            self._next_id += 1
            self.engine.add_request(request_ids[-1], prompt_ids, RequestSpec(p))
        tokens: dict[str, list[int]] = {r: [] for r in request_ids}
        reasons: dict[str, str] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
                if out.finish_reason is not None:
                    reasons[out.request_id] = out.finish_reason
        return [
            Completion(self.tokenizer.decode(tokens[r]), tokens[r], reasons[r], prompt_ids)
            for r, prompt_ids in zip(request_ids, ids, strict=True)
        ]

    def chat(
        self,
        conversations: list[Message] | list[list[Message]],
        sampling: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Apply the model's chat template to each conversation and generate the reply."""
        batch = (
            [conversations]
            if conversations and isinstance(conversations[0], dict)
            else cast(list[list[Message]], conversations)
        )
        texts = [self.tokenizer.apply_chat_template(c) for c in batch]
        return self.generate(texts, sampling)
