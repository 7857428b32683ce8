"""Tokenizer wrapper and the GGUF -> tokenizer.json rebuild.

Fast tests use a tiny byte-level vocabulary whose ids are worked out by hand; slow tests pin the
embedded SmolLM2 to transformers' own GGUF tokenizer conversion and chat template rendering.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from nitsum.tokenizer import Tokenizer
from nitsum.weights.gguf_tokenizer import build_tokenizer_json, bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["1 2", "Ġ w", "h e", "l l", "he ll", "hell o"]
# ids: specials 0-2, the 256 byte characters 3-258 (printable ASCII first: "1" is 3 + 49 - 33),
# then one token per merge from 259.
ONE, TWO, THREE, FOUR, FIVE = 19, 20, 21, 22, 23
SPACE = 3 + 188 + 32  # "Ġ": the 189th..256th characters are the non-printable bytes 0..
T12, T_W, T_HELLO = 259, 260, 264


def tiny_meta(pre: str = "smollm", **extra: object) -> dict:
    byte_chars = list(bytes_to_unicode().values())
    merged = [m.replace(" ", "") for m in MERGES]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": SPECIALS + byte_chars + merged,
        "tokenizer.ggml.token_type": [3] * 3 + [1] * (256 + len(merged)),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **extra,
    }


def tiny_dir(path: Path, template: str | None = None, **meta: object) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(build_tokenizer_json(tiny_meta(**meta)))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
    }
    if template is not None:
        tok_config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return path


def test_tiny_vocab_ids_by_hand(tmp_path: Path) -> None:
    d = tiny_dir(tmp_path)
    # the AddedToken-dict spelling of a special token (older transformers save it so)
    (d / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": {"__type": "AddedToken", "content": "<|im_start|>"}})
    )
    tok = Tokenizer.from_dir(d)
    assert tok.vocab_size == 265
    assert tok.encode("hello") == [T_HELLO]
    assert tok.encode("hello w") == [T_HELLO, T_W]
    assert tok.encode(" 12") == [SPACE, ONE, TWO]  # smollm: every digit alone
    assert tok.encode("<|im_start|>hello<|im_end|>") == [1, T_HELLO, 2]
    assert tok.encode("hello", add_special_tokens=True) == [T_HELLO]  # no BOS for this file
    assert tok.decode([1, T_HELLO, T_W, 2]) == "hello w"
    assert tok.decode([1, T_HELLO, 2], skip_special_tokens=False) == "<|im_start|>hello<|im_end|>"
    ids = tok.encode("é 世")
    assert len(ids) == 2 + 1 + 3  # two UTF-8 bytes, a space, three bytes; no merges apply
    assert tok.decode(ids) == "é 世"
    assert tok.decode(ids[:-1]) == "é \ufffd"  # an incomplete character never raises
    assert tok.eos_token_ids == [2, 0] and tok.bos_token_id == 1


@pytest.mark.parametrize(
    ("pre", "ids"),
    [
        ("smollm", [ONE, TWO, THREE, FOUR, FIVE]),  # \p{N} first: digits split one by one
        ("gpt-2", [T12, THREE, FOUR, FIVE]),  # the whole number is one pre-token
        ("llama-bpe", [T12, THREE, FOUR, FIVE]),  # \p{N}{1,3}: "123" "45"
    ],
)
def test_pre_tokenizer_follows_gguf_pre(tmp_path: Path, pre: str, ids: list[int]) -> None:
    assert Tokenizer.from_dir(tiny_dir(tmp_path, pre=pre)).encode("12345") == ids


def test_add_bos_token_from_gguf(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir(tmp_path, **{"tokenizer.ggml.add_bos_token": True}))
    assert tok.encode("hello", add_special_tokens=True) == [1, T_HELLO]
    assert tok.encode("hello") == [T_HELLO]


def test_unsupported_gguf_tokenizers() -> None:
    with pytest.raises(ValueError, match="pre-tokenizer 'mystery'"):
        build_tokenizer_json(tiny_meta(pre="mystery"))
    with pytest.raises(ValueError, match="tokenizer model 'llama'"):
        build_tokenizer_json(tiny_meta(**{"tokenizer.ggml.model": "llama"}))


TRICKY_TEMPLATE = """{{ bos_token }}
{% for m in messages %}
    {% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}
    {% if loop.index > 3 %}{% break %}{% endif %}
    <{{ m['role'] }}>{{ m['content'] | tojson }}{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<assistant>{% endif %}"""


def test_chat_template_matches_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    d = tiny_dir(tmp_path, template=TRICKY_TEMPLATE)
    ours, theirs = Tokenizer.from_dir(d), AutoTokenizer.from_pretrained(d)
    msgs = [
        {"role": "system", "content": "Be <brief> & kind"},
        {"role": "user", "content": 'say "héllo"'},
    ]
    for gen in (True, False):
        want = theirs.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == want
    got = ours.apply_chat_template(msgs)
    # hand-checked: trim_blocks drops the newline after a block tag, lstrip_blocks the indent
    # before one (not before text); tojson neither HTML-escapes nor ASCII-escapes
    assert got == (
        '<|im_start|>\n    <system>"Be <brief> & kind"<|im_end|>\n'
        '    <user>"say \\"héllo\\""<|im_end|>\n<assistant>'
    )
    with pytest.raises(jinja2.TemplateError, match="no tools here"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_chat_template_is_sandboxed(tmp_path: Path) -> None:
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    tok = Tokenizer.from_dir(tiny_dir(tmp_path, template=evil))
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_template_file_and_missing_template(tmp_path: Path) -> None:
    d = tiny_dir(tmp_path / "a", template="from config")
    (d / "chat_template.jinja").write_text("from file {{ messages | length }}")
    assert Tokenizer.from_dir(d).apply_chat_template([{"role": "user", "content": "x"}]) == (
        "from file 1"
    )
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_dir(tiny_dir(tmp_path / "b")).apply_chat_template([])
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path / "c")


# ---- the embedded SmolLM2 against transformers' GGUF tokenizer conversion (slow) ----

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "12345",
    "pi is 3.14159, and 2024-01-02 was a Tuesday",
    "héllo 世界 🙂",
    "naïve café — “quotes” 3½ x²",
    "a   b\n\n\tc  \n",
    "   leading and trailing   ",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "def f(x):\n    return x**2  # comment",
    "I'm sure they'll've done it; it's DONE'S",
]


@pytest.fixture(scope="session")
def hf_gguf_tokenizer():
    """transformers' tokenizer converted from the embedded GGUF itself."""
    from transformers import AutoTokenizer

    from nitsum.weights.prepare import embedded_gguf_path

    path = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.slow
def test_smollm2_ids_equal_transformers_gguf(smollm2_dir: Path, hf_gguf_tokenizer) -> None:
    ours = Tokenizer.from_dir(smollm2_dir)
    conversation = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of France? 🙂"},
    ]
    prompt = ours.apply_chat_template(conversation)
    for text in [*TEXTS, prompt]:
        ids = ours.encode(text)
        assert ids == hf_gguf_tokenizer.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.encode("12345") == [33, 34, 35, 36, 37]
    # NOTE: llama.cpp's "smollm" split (and SmolLM2's own tokenizer.json, Digits(individual))
    # isolates every \p{N} character, also from a preceding space. transformers 5.23's GGUF
    # converter has no "smollm" entry and keeps " ½" whole ("Ġ½" -> different ids), so these are
    # checked against the rule instead of against transformers.
    for head, num, tail in ((" ", "½", ""), (" ", "²", ""), ("a ", "٣", "b")):
        want = ours.encode(head) + ours.encode(num) + ours.encode(tail)
        assert ours.encode(head + num + tail) == want
    assert ours.encode(" ½") == [216, *ours.encode("½")]
    assert ours.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert ours.decode(ours.encode(prompt)).startswith("system\nYou answer")  # specials skipped
    assert (ours.eos_token_ids, ours.bos_token_id, ours.vocab_size) == ([2], 1, 49152)


@pytest.mark.slow
def test_smollm2_prepared_tokenizer_in_transformers(smollm2_dir: Path, hf_gguf_tokenizer) -> None:
    from transformers import AutoTokenizer

    ours, theirs = Tokenizer.from_dir(smollm2_dir), AutoTokenizer.from_pretrained(smollm2_dir)
    for text in TEXTS:
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
    ]
    for msgs in conversations:
        for gen in (True, False):
            want = theirs.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == want
            gguf_want = hf_gguf_tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=gen
            )
            assert want == gguf_want
    first = ours.apply_chat_template(conversations[0])
    assert first.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert first.endswith("<|im_start|>assistant\n4<|im_end|>\n<|im_start|>assistant\n")
