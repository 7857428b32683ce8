"""Build a TP-1 engine from a model name or HF model directory on disk (worker and LLM API)."""

from __future__ import annotations

import logging
from pathlib import Path

from nitsum.config import ModelConfig
from nitsum.engine.build import EngineConfig, build_engine
from nitsum.engine.engine import Engine

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


def load_engine(model_dir: str | Path, ecfg: EngineConfig | None = None) -> Engine:
    """Load HF safetensors weights from `model_dir` into a single-device engine.

    EOS ids come from the tokenizer files when they can be read (generation_config and
    tokenizer_config often name more than config.json), else from config.json.
    """
    # Imported here so that the worker package (and its tests on in-memory models) does not
    # depend on the weights/tokenizer modules at import time.
    from nitsum.weights.hf import iter_hf_tensors, load_hf_config

    model_dir = Path(model_dir)
    cfg = ModelConfig.from_hf(load_hf_config(model_dir))
    eos: tuple[int, ...] | None = None
    try:
        from nitsum.tokenizer import Tokenizer

        eos = tuple(Tokenizer.from_dir(model_dir).eos_token_ids) or None
    except Exception as e:  # no tokenizer files is fine for a worker: ids in, ids out
        log.warning("no tokenizer EOS ids from %s (%s); using config.json", model_dir, e)
    return build_engine(cfg, iter_hf_tensors(model_dir), ecfg or EngineConfig(), eos)
