"""Rebuild an HF ``tokenizer.json`` from the tokenizer a GGUF file describes in its metadata.

A GGUF carries no ``tokenizer.json``: llama.cpp stores the vocabulary, the BPE merges, per-token
types and a pre-tokenizer *name* (``tokenizer.ggml.pre``) instead. We support byte-level BPE
(``tokenizer.ggml.model == "gpt2"``), which is what SmolLM2, Llama 3, Qwen2 and most recent models
use, and map each pre-tokenizer name to the split that llama.cpp (and the model's original
``tokenizer.json``) applies.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp token types (``tokenizer.ggml.token_type``).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# NOTE: keys are llama.cpp's `tokenizer.ggml.pre` names; each group shares one regex in
# llama.cpp's llama-vocab.cpp. "smollm" & co: every digit is its own pre-token, then GPT-2's regex
# (exactly the SmolLM2/StarCoder tokenizer.json: Digits(individual) + ByteLevel(use_regex)).
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
# NOTE: files older than `tokenizer.ggml.pre` say nothing ("default"); their models were almost
# all GPT-2 style, so we split like GPT-2 (llama.cpp uses its own generic regex and warns).
_GPT2 = {"gpt-2", "gpt2", "default"}
_LLAMA3 = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx"}
_QWEN2 = {"qwen2", "deepseek-r1-qwen"}
# llama.cpp skips BPE merging when a whole pre-token is a vocabulary entry for these.
_IGNORE_MERGES = _LLAMA3


def supported_pre_tokenizers() -> list[str]:
    """The ``tokenizer.ggml.pre`` values we can rebuild."""
    return sorted(_DIGITS_THEN_GPT2 | _GPT2 | _LLAMA3 | _QWEN2)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    split = _LLAMA3_SPLIT if pre in _LLAMA3 else _QWEN2_SPLIT if pre in _QWEN2 else None
    if split is None:
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {supported_pre_tokenizers()}"
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _post_processor(meta: dict[str, Any], tokens: list[str]) -> processors.PostProcessor:
    """Prepend BOS / append EOS when the file says llama.cpp adds them (only on request)."""
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
    if not (add_bos or add_eos):
        return processors.ByteLevel(trim_offsets=False)
    head = [tokens[bos_id]] if bos_id is not None and add_bos else []
    tail = [tokens[eos_id]] if eos_id is not None and add_eos else []
    ids = {tokens[i]: i for i, on in ((bos_id, add_bos), (eos_id, add_eos)) if i is not None and on}
    return processors.TemplateProcessing(
        single=" ".join([*head, "$A:0", *tail]),
        pair=" ".join([*head, "$A:0", *tail, *(f"{t}:1" for t in head), "$B:1", *tail]),
        special_tokens=list(ids.items()),
    )


def build_tokenizer_json(meta: dict[str, Any]) -> str:
    """Return a ``tokenizer.json`` (as a string) for the tokenizer described by GGUF ``meta``.

    ``meta`` maps GGUF metadata keys to plain Python values (lists for arrays).

    Raises:
        ValueError: the tokenizer model or pre-tokenizer is not one we can rebuild.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model {kind!r} (tokenizer.ggml.model) is not supported; "
            "only byte-level BPE ('gpt2') is"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    pre = meta.get("tokenizer.ggml.pre", "default")
    pre_tokenizer = _pre_tokenizer(pre)  # fail on an unknown split before the costly part

    # NOTE: a byte-level vocabulary is spelled in the bytes_to_unicode alphabet. Control and
    # user-defined tokens are matched verbatim in the text (as added tokens), so they keep their
    # spelling; any other token outside the alphabet is respelled from its UTF-8 bytes, as
    # transformers' GGUF converter does.
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, (tok, typ) in enumerate(zip(tokens, types, strict=True)):
        if typ not in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and not set(tok) <= alphabet:
            tok = "".join(spelling[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    merges: list[tuple[str, str]] = []
    for m in meta.get("tokenizer.ggml.merges", []):
        left, sep, right = m.partition(" ")
        if not sep or " " in right:
            raise ValueError(f"malformed GGUF merge {m!r}: expected two tokens")
        merges.append((left, right))

    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=pre in _IGNORE_MERGES,
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(meta, tokens)
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, typ in zip(tokens, types, strict=True)
            if typ == TOKEN_CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, typ in zip(tokens, types, strict=True)
            if typ == TOKEN_USER_DEFINED
        ]
    )
    return tokenizer.to_str()
