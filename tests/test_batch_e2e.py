"""Issue 30 item 4 end to end on `nitsum serve` (Rust router + 1 CPU worker, the embedded
SmolLM2-135M-Instruct): lm-eval's batched loglikelihood request (a list of prompts, `echo`,
`logprobs`, `max_tokens: 0`) scores each prompt exactly as the prompt sent alone, and
`/generate`'s `regex` and `ebnf` constrain what the model writes."""

from __future__ import annotations

import re

import pytest

from test_openai_sampling import MODEL, client, http, server, tok  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is Paris", "One, two, three, four", "Hello"]


def test_batched_echo_logprobs_equal_the_single_prompt_ones(client, tok) -> None:  # noqa: F811
    """lm-eval `--batch_size 3`: one request of three token-id prompts; each choice's
    token-level loglikelihoods are those of its prompt sent alone, in prompt order."""
    batch = [tok.encode(p) for p in PROMPTS]
    r = client.completions.create(
        model=MODEL, prompt=batch, max_tokens=0, temperature=0, logprobs=1, echo=True
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.prompt_tokens == sum(len(ids) for ids in batch)
    assert r.usage.completion_tokens == 0
    for ids, choice in zip(batch, r.choices, strict=True):
        alone = client.completions.create(
            model=MODEL, prompt=[ids], max_tokens=0, temperature=0, logprobs=1, echo=True
        ).choices[0]
        lp, want = choice.logprobs, alone.logprobs
        # The prompt only: its tokens, the first with no logprob.
        assert lp.tokens == [tok.decode([t]) for t in ids] == want.tokens
        assert choice.text == tok.decode(ids) == alone.text
        assert lp.token_logprobs[0] is None
        assert lp.token_logprobs[1:] == pytest.approx(want.token_logprobs[1:], abs=1e-4)
        assert all(v < 0 for v in lp.token_logprobs[1:])
        assert choice.finish_reason == "length"
    # A batch of texts gives the same scores as the batch of their ids.
    texts = client.completions.create(
        model=MODEL, prompt=PROMPTS, max_tokens=0, temperature=0, logprobs=1, echo=True
    )
    for a, b in zip(texts.choices, r.choices, strict=True):
        assert a.logprobs.token_logprobs[1:] == pytest.approx(
            b.logprobs.token_logprobs[1:], abs=1e-4
        )


def test_a_streamed_batch_scores_each_prompt_under_its_index(client, tok) -> None:  # noqa: F811
    batch = [tok.encode(p) for p in PROMPTS]
    whole = client.completions.create(
        model=MODEL, prompt=batch, max_tokens=0, temperature=0, logprobs=1, echo=True
    )
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=batch, max_tokens=0, temperature=0, logprobs=1, echo=True,
            stream=True,
        )
    )  # fmt: skip
    texts: dict[int, str] = {}
    scores: dict[int, list[float | None]] = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.logprobs is not None:
                scores.setdefault(ch.index, []).extend(ch.logprobs.token_logprobs)
    assert sorted(texts) == [0, 1, 2]
    for i, choice in enumerate(whole.choices):
        assert texts[i] == choice.text
        assert scores[i][0] is None
        assert scores[i][1:] == pytest.approx(choice.logprobs.token_logprobs[1:], abs=1e-6)


def test_batched_generation_equals_single_prompts_with_n(client) -> None:  # noqa: F811
    """Greedy: each choice of a batch with n = 2 is its prompt's answer alone."""
    r = client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=6, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, p in enumerate(PROMPTS[:2]):
        alone = client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0)
        assert r.choices[2 * i].text == r.choices[2 * i + 1].text == alone.choices[0].text


def test_generate_regex_and_ebnf_constrain_the_output(http) -> None:  # noqa: F811
    sp = {"max_new_tokens": 12, "temperature": 0}
    body = {"text": "My phone number is", "sampling_params": {**sp, "regex": r"[0-9]{3}-[0-9]{4}"}}
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", r.json()["text"]), r.json()
    assert r.json()["meta_info"]["finish_reason"] == {"type": "stop"}
    ebnf = 'root ::= answer "." \nanswer ::= "yes" | "no"'
    body = {"text": ["Is the sky blue?", "Is fire cold?"], "sampling_params": {**sp, "ebnf": ebnf}}
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert [x["text"] for x in r.json()] != [] and all(
        x["text"] in ("yes.", "no.") for x in r.json()
    ), r.json()
    # An EBNF grammar the worker cannot compile is the client's 400, naming the field.
    bad = {"text": "x", "sampling_params": {**sp, "ebnf": "root ::= undefined_rule"}}
    r = http.post("/generate", json=bad)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "sampling_params.ebnf"
