"""Find and read a model on disk: `--model` to an HF directory, its config, tensors and EOS ids."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from nitsum.config import ModelConfig

log = logging.getLogger(__name__)


def resolve_model_dir(model: str | Path | None) -> Path:
    """An HF model directory for `--model` ("default", a directory, a .gguf file).

    A directory with config.json is used as is, without importing the weights package.
    """
    path = Path(model).expanduser() if model is not None else None
    if path is not None and (path / "config.json").is_file():
        return path
    from nitsum.weights.prepare import resolve_model  # NOTE: imported late, see docs/serving.md

    return resolve_model(model)


def model_eos_ids(model_dir: Path) -> tuple[int, ...] | None:
    """EOS ids from the tokenizer files (generation_config and tokenizer_config often name
    more than config.json), else None (config.json's are used)."""
    try:
        from nitsum.tokenizer import Tokenizer

        return tuple(Tokenizer.from_dir(model_dir).eos_token_ids) or None
    except Exception as e:  # no tokenizer files is fine for a worker: ids in, ids out
        log.warning("no tokenizer EOS ids from %s (%s); using config.json", model_dir, e)
        return None


def install_grammars(model_dir: Path, eos_token_ids: tuple[int, ...] | None) -> None:
    """Structured output compiles its grammars against this model's tokenizer."""
    from nitsum.structured.compiler import install

    install(model_dir, eos_token_ids)


def load_config(model_dir: str | Path) -> ModelConfig:
    """The model configuration of the HF directory `model_dir` (its config.json)."""
    # Imported here so that the worker package (and its tests on in-memory models) does not
    # depend on the weights/tokenizer modules at import time.
    from nitsum.weights.hf import load_hf_config

    return ModelConfig.from_hf(load_hf_config(model_dir))


def load_model(model_dir: str | Path) -> tuple[ModelConfig, Iterable[tuple[str, torch.Tensor]]]:
    """(config, HF-named tensors) of the HF safetensors directory `model_dir`; the tensors
    are read as the iterator is consumed."""
    from nitsum.weights.hf import iter_hf_tensors

    return load_config(model_dir), iter_hf_tensors(model_dir)
