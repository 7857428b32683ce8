"""A byte-level BPE tokenizer widened to a larger vocabulary: the stand-in for Llama-3's
128,256 tokens that gpu_check's served random model needs (no model hub here, so no real
Llama-3 tokenizer).

The source tokenizer (SmolLM2's, 49,152 tokens) keeps every id, merge and special token, so it
encodes any text exactly as before; ids from its size up to `size` are new vocabulary
entries, each the concatenation of two of its plain printable tokens (`Ġthe` + `ing`), which
no merge produces. Every id below `size` then decodes to text (the router and the worker
check prompt ids against, and detokenize outputs with, this vocabulary), so a model of
Llama-3's vocabulary can be served, prompted with ids from all of it and streamed, as a real
Llama-3 would be.

    python scripts/wide_tokenizer.py SRC_DIR DST_DIR --size 128256
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

LLAMA3_VOCAB = 128256
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
# Byte-level BPE spells a space Ġ and a newline Ċ; every other printable ASCII byte is itself.
PLAIN = set(map(chr, range(0x21, 0x7F))) | {"Ġ", "Ċ"}


def _plain_tokens(vocab: dict[str, int], special: set[str]) -> list[str]:
    """The source's tokens spelled in printable ASCII (and Ġ / Ċ), by id: text of their own,
    never part of a multi-byte character."""
    ordered = sorted(vocab, key=vocab.__getitem__)
    return [t for t in ordered if t not in special and set(t) <= PLAIN]


def _new_entries(vocab: dict[str, int], special: set[str]) -> Iterator[str]:
    """Pairs of plain tokens not in the vocabulary, in a fixed order: the square of the first
    k plain tokens (BPE numbers the frequent ones first) grown by one row and one column at a
    time, so the entries do not depend on how many are asked for."""
    plain = _plain_tokens(vocab, special)
    seen = set(vocab)
    for k, new in enumerate(plain):
        for old in plain[: k + 1]:
            for text in dict.fromkeys((new + old, old + new)):  # NOTE: one pair when old is new
                if text not in seen:
                    seen.add(text)
                    yield text


def size_of(tokenizer: dict) -> int:
    """Ids of a parsed tokenizer.json: its model's vocabulary and its added tokens."""
    vocab = tokenizer["model"].get("vocab") or {}
    ids = [*(vocab.values() if isinstance(vocab, dict) else range(len(vocab)))]
    ids += [t["id"] for t in tokenizer.get("added_tokens", [])]
    return max(ids, default=-1) + 1


def widen(tokenizer: dict, size: int) -> dict:
    """`tokenizer` (a parsed tokenizer.json) with its vocabulary filled up to `size` ids (as
    it is when it has that many). Raises ValueError for a `size` below its own, or for a
    tokenizer to widen that is not a byte-level BPE."""
    have = size_of(tokenizer)
    if size < have:
        raise ValueError(f"widen: the tokenizer has {have} ids, more than {size}")
    if size == have:
        return tokenizer
    model = tokenizer["model"]
    if model.get("type") != "BPE" or (tokenizer.get("decoder") or {}).get("type") != "ByteLevel":
        raise ValueError("widen: only a byte-level BPE tokenizer.json can be widened")
    vocab: dict[str, int] = dict(model["vocab"])
    special = {t["content"] for t in tokenizer.get("added_tokens", [])}
    for i, text in zip(range(have, size), _new_entries(vocab, special), strict=False):
        vocab[text] = i
    if max(vocab.values()) < size - 1:
        raise ValueError(f"widen: too few plain tokens to make {size} ids")
    return tokenizer | {"model": model | {"vocab": vocab}}


def widen_dir(src: Path, dst: Path, size: int) -> None:
    """Copy the tokenizer files of `src` into `dst`, its tokenizer.json widened to `size`."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and name != "tokenizer.json":
            shutil.copy(src / name, dst / name)
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    text = json.dumps(widen(tok, size), ensure_ascii=False)
    (dst / "tokenizer.json").write_text(text, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--size", type=int, default=LLAMA3_VOCAB)
    args = ap.parse_args()
    widen_dir(args.src, args.dst, args.size)


if __name__ == "__main__":
    main()
