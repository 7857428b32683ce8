"""Tokenizer and chat template of an HF model directory, without transformers.

Encoding/decoding uses the ``tokenizers`` library on ``tokenizer.json``; the chat template is
rendered with a sandboxed jinja2 environment set up the way transformers' ``apply_chat_template``
sets it up, so prompts are byte-identical to what the model was trained/evaluated with.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # NOTE: like transformers: jinja's own tojson HTML-escapes, which would change prompts.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@cache
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _token_content(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class Tokenizer:
    """Text <-> token ids and chat prompts for one model directory."""

    def __init__(
        self,
        tokenizer: _HFTokenizer,
        chat_template: str | None,
        special_tokens: dict[str, str | None],
        eos_token_ids: list[int],
        bos_token_id: int | None,
    ) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        self.eos_token_ids: list[int] = eos_token_ids
        self.bos_token_id: int | None = bos_token_id
        # NOTE: the tokenizer's size (incl. added tokens); the model's embedding may be larger.
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` and the template/special tokens of an HF model directory.

        Raises:
            FileNotFoundError: the directory has no ``tokenizer.json``.
        """
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        tok = _HFTokenizer.from_file(str(path))
        tok_config = _read_json(model_dir / "tokenizer_config.json")
        config = _read_json(model_dir / "config.json")
        gen_config = _read_json(model_dir / "generation_config.json")

        special = {
            name: _token_content(tok_config.get(name))
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        # NOTE: transformers >= 4.43 saves the template as chat_template.jinja, which wins.
        template_file = model_dir / "chat_template.jinja"
        if template_file.is_file():
            template: Any = template_file.read_text(encoding="utf-8")
        else:
            template = tok_config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default")

        def token_id(content: str | None) -> int | None:
            return None if content is None else tok.token_to_id(content)

        # Stop on every end token any of the files declares; generation_config's first.
        eos = _as_list(gen_config.get("eos_token_id")) + _as_list(config.get("eos_token_id"))
        eos += _as_list(token_id(special["eos_token"]))
        bos = token_id(special["bos_token"])
        if bos is None:
            bos = gen_config.get("bos_token_id", config.get("bos_token_id"))
        return cls(tok, template, special, list(dict.fromkeys(eos)), bos)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text (``<|im_start|>``) are
        matched whole; ``add_special_tokens`` adds the post-processor's BOS/EOS, if any."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Bytes of an incomplete UTF-8 sequence decode to U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with the model's template.

        Raises:
            ValueError: the model has no chat template.
            jinja2.TemplateError: the template rejects the conversation (``raise_exception``).
        """
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send a plain completion instead")
        return _compile(self.chat_template).render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )
