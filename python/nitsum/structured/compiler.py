"""Grammars compiled against the model's tokenizer with llguidance.

One `GrammarCompiler` per tokenizer (building llguidance's token trie takes about a second);
the process's compiler is installed once by whoever loads the model (`install`), since the
engine knows token ids only.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from nitsum.errors import InvalidRequestError
from nitsum.structured.matcher import GrammarMatcher
from nitsum.structured.spec import FIELD, TEXT_KINDS, GrammarSpec, field_of

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# NOTE: compact separators and no free whitespace: a model that may emit whitespace between
# tokens can (and a small one does) loop on it until max_tokens.
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_ANY_OBJECT = {"type": "object"}
# NOTE: llguidance's default errors carry its parser state and the whole grammar; a client
# reads this error (400 or a stream's error event), so it gets the reason alone.
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class GrammarCompiler:
    """Compiles grammar specs for one tokenizer; compiled grammars cached by schema text."""

    def __init__(self, tokenizer_json: str, eos_token_ids: list[int]) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos_token_ids or None)
        self._compile = lru_cache(maxsize=256)(self._compile_uncached)

    @property
    def vocab_size(self) -> int:
        """Token ids the grammar's masks cover (ids at or above it are never allowed)."""
        return self.tokenizer.vocab_size

    def _compile_uncached(self, kind: str, schema: str | None) -> str:
        if kind in TEXT_KINDS:
            return self._compile_text(kind, schema)
        source: Any = _ANY_OBJECT
        if kind == "json_schema":
            if schema is None:  # `GrammarSpec.from_wire` refuses it; a direct caller may not
                raise InvalidRequestError(FIELD, "a json_schema grammar needs its schema text")
            source = json.loads(schema)
        if isinstance(source, bool):  # `true` accepts anything JSON, `false` nothing
            source = {} if source else {"not": {}}
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(source, _JSON_OPTIONS)
        except ValueError as e:
            raise InvalidRequestError(FIELD, f"invalid JSON schema: {e}") from e
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise InvalidRequestError(FIELD, f"invalid JSON schema: {error}")
        return grammar

    def _compile_text(self, kind: str, text: str | None) -> str:
        """A `regex`, `lark` or `ebnf` (GBNF) grammar, validated against the tokenizer."""
        field = field_of(kind)
        if not text:
            raise InvalidRequestError(field, f"a {kind} grammar needs its source text")
        try:
            if kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(text)
            elif kind == "lark":
                grammar = llguidance.LLMatcher.grammar_from_lark(text)
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(text))
        except Exception as e:  # the converter raises its own types on malformed EBNF
            raise InvalidRequestError(field, f"invalid {kind} grammar: {e}") from e
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise InvalidRequestError(field, f"invalid {kind} grammar: {error}")
        return grammar

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        """A fresh matcher for `spec` (having consumed nothing); InvalidRequestError naming
        `response_format` with the library's message if it cannot compile."""
        grammar = self._compile(spec.kind, spec.schema)
        inner = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=_LIMITS)
        return GrammarMatcher(inner, self.vocab_size)

    def check(self, spec: GrammarSpec) -> None:
        """Raise InvalidRequestError if `spec` does not compile."""
        self._compile(spec.kind, spec.schema)


# The process's tokenizer for grammars: a tokenizer.json path and EOS ids (built on first use).
_source: tuple[str, tuple[int, ...]] | None = None
_current: GrammarCompiler | None = None


@lru_cache(maxsize=4)
def _for_file(path: str, eos: tuple[int, ...]) -> GrammarCompiler:
    return GrammarCompiler(Path(path).read_text(encoding="utf-8"), list(eos))


def install(model_dir: str | Path, eos_token_ids: list[int] | tuple[int, ...] | None) -> None:
    """Compile grammars against the tokenizer of HF directory `model_dir` (a model without
    tokenizer.json serves no grammars). Cheap: the compiler is built by the first grammar."""
    global _source, _current
    path = Path(model_dir) / "tokenizer.json"
    _source = (str(path), tuple(eos_token_ids or ())) if path.is_file() else None
    _current = None


def use(compiler: GrammarCompiler | None) -> None:
    """Install `compiler` directly (tests; None: no grammars)."""
    global _source, _current
    _source, _current = None, compiler


def current() -> GrammarCompiler:
    """The installed compiler; InvalidRequestError when there is none."""
    global _current
    if _current is None and _source is not None:
        _current = _for_file(*_source)
    if _current is None:
        raise InvalidRequestError(FIELD, "this worker has no tokenizer to compile grammars with")
    return _current
