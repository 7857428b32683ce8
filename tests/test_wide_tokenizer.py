"""scripts/wide_tokenizer.py: SmolLM2's tokenizer widened to Llama-3's 128,256 ids (the served
random model's vocabulary in gpu_check.sh) encodes text exactly as before and decodes every
id, old and new, to text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from nitsum.engine.load import resolve_model_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import wide_tokenizer as wt  # noqa: E402

TEXT = "The 42 quick brown foxes jumped over the lazy dog's café.\n<|im_end|>"


@pytest.fixture(scope="module")
def widened(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Tokenizer]:
    src = resolve_model_dir(None)
    dst = tmp_path_factory.mktemp("wide")
    wt.widen_dir(src, dst, wt.LLAMA3_VOCAB)
    assert (dst / "tokenizer_config.json").is_file() and (dst / "chat_template.jinja").is_file()
    return Tokenizer.from_file(str(src / "tokenizer.json")), Tokenizer.from_file(
        str(dst / "tokenizer.json")
    )


def test_the_widened_tokenizer_encodes_as_before_and_decodes_every_new_id(widened):
    small, wide = widened
    assert small.get_vocab_size(True) == 49152 and wide.get_vocab_size(True) == 128256
    assert wide.encode(TEXT).ids == small.encode(TEXT).ids
    new = range(49152, 128256)
    texts = [wide.decode([i]) for i in new]
    assert all(texts) and "\ufffd" not in "".join(texts)
    # Each new id is two old tokens: it decodes as they do, one after the other.
    vocab = wide.get_vocab()
    pieces = {i: t for t, i in vocab.items()}
    a, b = next((x, y) for x in range(17, 400) for y in range(17, 400)
                if pieces[x] + pieces[y] == pieces[100000])  # fmt: skip
    assert wide.decode([100000]) == small.decode([a, b])
    # Special tokens stay special (skipped when decoding, as the router does).
    assert wide.decode([2, 100000]) == wide.decode([100000])


def test_widening_is_refused_where_it_cannot_hold():
    tok = json.loads((resolve_model_dir(None) / "tokenizer.json").read_text())
    with pytest.raises(ValueError, match="more than 1000"):
        wt.widen(tok, 1000)
    assert wt.widen(tok, 49152) is tok
    unigram = tok | {"model": {"type": "Unigram", "vocab": [["a", 0.0]] * 10}}
    with pytest.raises(ValueError, match="only a byte-level BPE"):
        wt.widen(unigram, 20)
