"""Read an HF model directory: ``config.json`` and its safetensors shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"


def load_hf_config(model_dir: str | Path) -> dict:
    """Return ``model_dir/config.json`` as a dict.

    Raises:
        FileNotFoundError: the directory or its ``config.json`` does not exist.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} is not an HF model directory: {path.name} not found in it"
        )
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _shard_files(model_dir: Path) -> list[Path]:
    """The safetensors shards of ``model_dir``, in a stable order."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        with index.open(encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        # NOTE: the index maps every tensor to its shard; a shard appears many times.
        shards = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that do not exist: {missing}")
        return shards
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        found = sorted(p.name for p in model_dir.glob("*.bin"))
        hint = f" (found {found}; only safetensors are supported)" if found else ""
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}{hint}")
    return shards


def iter_hf_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor of every safetensors shard of ``model_dir``.

    Names are HF's (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``, ...) and
    dtypes are as stored. A tied ``lm_head`` is absent when the checkpoint omits it.
    """
    for shard in _shard_files(Path(model_dir)):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                yield name, f.get_tensor(name)
