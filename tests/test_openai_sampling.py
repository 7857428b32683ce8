"""End to end with the official `openai` client: the sampling fields of issue 18 on
`nitsum serve` (Rust router + 1 CPU worker, the embedded SmolLM2-135M-Instruct), values
checked against the HF model run in this process (fp32, as the worker): logprobs, n > 1
(prefill shared: the worker's prefix-cache hits), penalties, logit_bias, min_tokens, min_p,
the native `/generate` names, and 400s naming the bad field."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from nitsum.ports import free_port
from nitsum.tokenizer import Tokenizer
from test_serve_e2e import (
    Server,
    find_children,
    launch,
    metrics,
    serve_command,
    stop_server,
    wait_for,
)

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
PAGE = 16  # the worker's tokens per KV page (its --page-tokens default)
PROMPT = "The capital of France is"
HTTP_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, nitsum_cache: Path, tmp_path_factory) -> Iterator[Server]:
    import os

    log_path = tmp_path_factory.mktemp("sampling-e2e") / "serve.log"
    port, zport = free_port(), free_port()
    env = dict(os.environ, NITSUM_CACHE=str(nitsum_cache), PYTHONUNBUFFERED="1")
    cmd = [
        *serve_command(), "--model", str(smollm2_dir), "--workers", "1", "--no-control",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-addr", f"tcp://127.0.0.1:{zport}", "--kv-cache-mb", "128",
        "--startup-timeout", "200", "--stop-timeout", "5",
    ]  # fmt: skip
    srv, _ = launch(cmd, env, log_path, 210)
    try:
        find_children(srv, 1)
        yield srv
    finally:
        stop_server(srv)
        print(f"--- nitsum serve log ---\n{srv.log_tail(100)}")


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="x", timeout=HTTP_TIMEOUT_S, max_retries=0)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=HTTP_TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture(scope="module")
def hf(smollm2_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, torch_dtype=torch.float32).eval()


def reference(hf, prompt: list[int], n: int, freq=0.0, pres=0.0, rep=1.0, bias=None):
    """Greedy decoding over the HF model with vLLM's processors, one token at a time:
    the tokens and each step's log-softmax of the processed logits."""
    out: list[int] = []
    steps = []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out])).logits[0, -1].float()
        for t, b in (bias or {}).items():
            logits[t] += b
        for t in set(prompt) | set(out):
            logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
        for t in set(out):
            logits[t] -= freq * out.count(t) + pres
        steps.append(torch.log_softmax(logits, -1))
        out.append(int(logits.argmax()))
    return out, steps


def test_completion_logprobs_are_the_models_and_agree_when_streamed(client, tok, hf) -> None:
    ids = tok.encode(PROMPT)
    r = client.completions.create(
        model=MODEL,
        prompt=ids,
        max_tokens=5,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    want, steps = reference(hf, ids, 5)
    assert [tok.decode([t]) for t in want] == lp.tokens
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for i, step in enumerate(steps):
        assert lp.token_logprobs[i] == pytest.approx(float(step[want[i]]), abs=1e-4)
        top = step.topk(3)
        # NOTE: a JSON object: its key order is not the ranking.
        assert sorted(lp.top_logprobs[i].values(), reverse=True) == pytest.approx(
            top.values.tolist(), abs=1e-4
        )
        assert set(lp.top_logprobs[i]) == {tok.decode([t]) for t in top.indices.tolist()}
        # Greedy: the chosen token is the most likely one.
        assert lp.token_logprobs[i] == pytest.approx(max(lp.top_logprobs[i].values()))
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=ids, max_tokens=5, temperature=0, logprobs=3, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [
        v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == lp.tokens
    assert values == pytest.approx(lp.token_logprobs, abs=1e-6)


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(client, tok, hf) -> None:
    """lm-evaluation-harness's loglikelihood request: token-id prompt, `echo`, `logprobs: 1`,
    `max_tokens: 1`. The prompt's tokens come first, the first with null logprob, the others
    with the model's log-softmax; streamed, the first chunk carries them."""
    ids = tok.encode(PROMPT + " Paris")
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    r = client.completions.create(
        model=MODEL, prompt=[ids], max_tokens=1, temperature=0, logprobs=1, echo=True, seed=1234
    )
    lp = r.choices[0].logprobs
    n = len(ids)
    assert lp.tokens[:n] == [tok.decode([t]) for t in ids]
    assert len(lp.tokens) == n + 1 and r.choices[0].text.startswith(tok.decode(ids))
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for j in range(1, n):
        assert lp.token_logprobs[j] == pytest.approx(float(want[j - 1, ids[j]]), abs=1e-4)
        best = int(want[j - 1].argmax())
        assert lp.top_logprobs[j] == {
            tok.decode([best]): pytest.approx(float(want[j - 1, best]), abs=1e-4)
        }
    # The generated token's logprob follows: the model's at the last prompt position.
    assert lp.token_logprobs[n] == pytest.approx(float(want[n - 1].max()), abs=1e-4)
    # lm-eval's own arithmetic over the continuation " Paris".
    ctxlen = len(tok.encode(PROMPT))
    score = sum(lp.token_logprobs[ctxlen:-1])
    assert score == pytest.approx(
        sum(float(want[j - 1, ids[j]]) for j in range(ctxlen, n)), abs=1e-3
    )
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=[ids], max_tokens=2, temperature=0, logprobs=1, echo=True,
            stream=True,
        )
    )  # fmt: skip
    first = chunks[0].choices[0]
    assert first.text.startswith(tok.decode(ids))
    assert first.logprobs.token_logprobs[:n] == pytest.approx([None, *lp.token_logprobs[1:n]])
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert len(streamed) == n + 2


def test_native_generate_logprobs_in_sglangs_shape(http, tok, hf) -> None:
    """`/generate` with `return_logprob`: SGLang's `output_token_logprobs` entries
    `[logprob, id, text]` and `output_top_logprobs`, the model's values, cumulative when
    streamed."""
    ids = tok.encode(PROMPT)
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        "return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": 2,
        "return_text_in_logprobs": True, "rid": "my-request-7",
    }  # fmt: skip
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    out, meta = r.json()["output_ids"], r.json()["meta_info"]
    want, steps = reference(hf, ids, 4)
    assert out == want and meta["id"] == "my-request-7"
    entries, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert [(e[1], e[2]) for e in entries] == [(t, tok.decode([t])) for t in want]
    for i, step in enumerate(steps):
        assert entries[i][0] == pytest.approx(float(step[want[i]]), abs=1e-4)
        top = step.topk(2)
        assert [t[1] for t in tops[i]] == top.indices.tolist()
        assert [t[0] for t in tops[i]] == pytest.approx(top.values.tolist(), abs=1e-4)
    # Without text, the third element is null; without alternatives, no top list.
    plain = {**body, "return_text_in_logprobs": False, "top_logprobs_num": 0, "stream": True}
    with http.stream("POST", "/generate", json=plain) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    last = chunks[-1]["meta_info"]
    got = last["output_token_logprobs"]
    assert [e[1] for e in got] == [e[1] for e in entries]
    assert [e[0] for e in got] == pytest.approx([e[0] for e in entries], abs=1e-6)
    assert all(e[2] is None for e in last["output_token_logprobs"])
    assert "output_top_logprobs" not in last
    # Cumulative like the text: each chunk has one entry per output id so far.
    assert all(len(c["meta_info"]["output_token_logprobs"]) == len(c["output_ids"]) for c in chunks)
    # With logprob_start_len >= 0 the prompt's too, from that token on (the first has none).
    with torch.no_grad():
        full = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    for start in (0, 2):
        r = http.post("/generate", json={**body, "logprob_start_len": start})
        meta = r.json()["meta_info"]
        got, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
        assert [e[1] for e in got] == ids[start:], r.text
        for i, e in zip(range(start, len(ids)), got, strict=True):
            if i == 0:
                assert e[0] is None and tops[0] is None
            else:
                assert e[0] == pytest.approx(float(full[i - 1, ids[i]]), abs=1e-4)
                assert [t[1] for t in tops[i - start]] == full[i - 1].topk(2).indices.tolist()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
        ({"return_logprob": True, "logprob_start_len": 10_000}, "logprob_start_len"),
        ({"return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
        ({"lora_path": "adapter-1"}, "lora_path"),
        ({"return_hidden_states": True}, "return_hidden_states"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"sampling_params": {"regex": "[0-9"}}, "sampling_params.regex"),
        ({"sampling_params": {"ebnf": "root ::= nowhere"}}, "sampling_params.ebnf"),
        ({"sampling_params": {"n": 17}}, "sampling_params.n"),
        ({"sampling_params": {"structural_tag": "{}"}}, "sampling_params.structural_tag"),
        ({"sampling_params": {"stop_regex": ["[0-9]"]}}, "sampling_params.stop_regex"),
        ({"sampling_params": {"json_schema": "{not json"}}, "sampling_params.json_schema"),
        ({"sampling_params": {"max_new_tokens": 4, "temprature": 0}}, "sampling_params.temprature"),
    ],
)
def test_native_generate_refuses_what_it_does_not_do_by_name(http, change, field) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}, **change}
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_native_generate_accepts_sglang_bench_serving_payload_and_json_schema(http) -> None:
    # What SGLang's bench_serving --backend sglang sends, at its defaults.
    body = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
        "stream": False, "lora_path": None, "return_logprob": False, "logprob_start_len": -1,
    }  # fmt: skip
    r = http.post("/generate", json=body)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 4, r.text
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    sp = {"max_new_tokens": 24, "temperature": 0, "json_schema": json.dumps(schema)}
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": sp})
    assert r.status_code == 200, r.text
    if r.json()["meta_info"]["finish_reason"]["type"] == "stop":  # complete: it validates
        value = json.loads(r.json()["text"])
        assert isinstance(value["n"], int)
    else:  # cut by max_new_tokens: still a prefix of valid JSON for the schema
        assert r.json()["text"].startswith('{"n":')


def test_chat_logprobs_shape_stream_and_non_stream(client) -> None:
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert (e.token, e.logprob) == (e.top_logprobs[0].token, e.top_logprobs[0].logprob)
        assert bytes(e.bytes) == e.token.encode()
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
            top_logprobs=2, stream=True,
        )
    )  # fmt: skip
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [
        (e.token, round(e.logprob, 5)) for e in content
    ]
    # Not asked: null.
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
    assert r.choices[0].logprobs is None


def test_n_choices_share_one_prefill_and_count_the_prompt_once(client, http, tok) -> None:
    # A prompt no earlier request cached: choice 0 prefills it all, the others reuse it.
    prompt = f"Request {uuid.uuid4().hex}: write three words about the sea, then stop."
    ids = tok.encode(prompt)
    shared = (len(ids) - 1) // PAGE * PAGE
    assert shared >= PAGE

    def hits() -> float | None:
        """The worker's prefix-cache hits (None until its first stats arrived)."""
        got = [
            v
            for (n, ls), v in metrics(http).items()
            if n == "nitsum_worker_stat" and ("name", "prefix_cache_hits") in ls
        ]
        return sum(got) if got else None

    def settled() -> float:
        """The hits once no report changed them for 1.5 s (3 heartbeats): the earlier tests'
        hits are all counted (a report still on its way made `before` stale, and this flaky)."""
        last, since = hits(), time.monotonic()
        while time.monotonic() - since < 1.5:
            time.sleep(0.25)
            if (now := hits()) != last:
                last, since = now, time.monotonic()
        return last

    wait_for("the worker's first stats", lambda: hits() is not None, 10)
    before = settled()
    kw = dict(
        model=MODEL, prompt=ids, max_tokens=8, temperature=1.5, seed=11, n=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    r = client.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.prompt_tokens == len(ids)  # once, not three times
    assert r.usage.completion_tokens == 3 * 8
    assert r.usage.total_tokens == len(ids) + 24
    # Prefilled once: each of the two other choices found the shared pages in the cache.
    wait_for("prefix_cache_hits", lambda: hits() - before == 2 * shared, 10)
    # Seeded: the choices differ (seed + index) and the response repeats.
    texts = [c.text for c in r.choices]
    assert len(set(texts)) > 1, texts
    assert [c.text for c in client.completions.create(**kw).choices] == texts
    # Streamed: chunks interleave by index and rebuild the same texts.
    got = ["", "", ""]
    ends = [0, 0, 0]
    for c in client.completions.create(**kw, stream=True):
        for ch in c.choices:
            got[ch.index] += ch.text
            ends[ch.index] += ch.finish_reason is not None
    assert got == texts and ends == [1, 1, 1]


def test_penalties_change_the_output_as_the_reference_predicts(client, http, tok, hf) -> None:
    ids = tok.encode("List the numbers: one, one, one, one,")
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    cases = [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 1.5},
    ]
    for c in cases:
        r = client.completions.create(
            model=MODEL,
            prompt=ids,
            max_tokens=8,
            temperature=0,
            extra_body={**c, "ignore_eos": True},
        )
        want, _ = reference(
            hf,
            ids,
            8,
            c.get("frequency_penalty", 0.0),
            c.get("presence_penalty", 0.0),
            c.get("repetition_penalty", 1.0),
        )
        assert r.choices[0].text == tok.decode(want), c
        assert r.choices[0].text != plain.choices[0].text, c
        # The native endpoint, SGLang's names: the same tokens.
        native = http.post(
            "/generate",
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                        "ignore_eos": True, **c}},
        )  # fmt: skip
        assert native.status_code == 200, native.text
        assert native.json()["output_ids"] == want, c


def test_logit_bias_min_tokens_and_min_p(client, http, tok) -> None:
    ids = tok.encode(PROMPT)
    forced = tok.encode(" banana")[0]
    r = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=4, temperature=0.7, seed=3,
        logit_bias={str(forced): 100},
    )  # fmt: skip
    assert r.choices[0].text == tok.decode([forced] * 4)
    eos = tok.eos_token_ids[0]
    bias = {str(eos): 100}
    now = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, temperature=0, logit_bias=bias
    )
    assert (now.usage.completion_tokens, now.choices[0].finish_reason) == (1, "stop")
    later = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, temperature=0, logit_bias=bias,
        extra_body={"min_tokens": 3},
    )  # fmt: skip
    assert (later.usage.completion_tokens, later.choices[0].finish_reason) == (4, "stop")
    native = http.post(
        "/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                    "logit_bias": bias, "min_new_tokens": 5}},
    ).json()  # fmt: skip
    assert len(native["output_ids"]) == 6 and native["output_ids"][-1] == eos
    assert eos not in native["output_ids"][:5]
    # min_p = 1 keeps only the most likely token: a hot seeded sample is the greedy answer.
    greedy = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    hot = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=2.0, seed=1,
        extra_body={"min_p": 1.0, "ignore_eos": True},
    )  # fmt: skip
    assert hot.choices[0].text == greedy.choices[0].text


def test_no_repeat_ngram_size_on_both_apis_as_the_reference_bans(client, http, tok, hf) -> None:
    """The field added to show the contract's cost (issue 41): greedy tokens against the HF
    model with every id that would repeat a bigram of prompt and output masked."""
    ids = tok.encode("List the numbers: one, one, one, one,")
    want: list[int] = []
    for _ in range(8):
        history = ids + want
        with torch.no_grad():
            logits = hf(torch.tensor([history])).logits[0, -1].float()
        for a, b in zip(history, history[1:], strict=False):
            if a == history[-1]:
                logits[b] = -float("inf")
        want.append(int(logits.argmax()))
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    body = {"no_repeat_ngram_size": 2, "ignore_eos": True}
    r = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, temperature=0, extra_body=body
    )
    assert r.choices[0].text == tok.decode(want) != plain.choices[0].text
    history = ids + want
    for i in range(len(ids), len(history)):  # no output token repeats a bigram before it
        assert (history[i - 1], history[i]) not in set(
            zip(history[: i - 1], history[1:i], strict=True)
        )
    native = http.post(
        "/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                    **body}},
    )  # fmt: skip
    assert native.status_code == 200, native.text
    assert native.json()["output_ids"] == want


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "n": 17}, "n"),
        ("/v1/completions", {"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
        ("/v1/completions", {"prompt": "hi", "frequency_penalty": -9}, "frequency_penalty"),
        ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 150}}, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ("/v1/completions", {"prompt": "hi", "min_p": -0.1}, "min_p"),
        ("/v1/completions", {"prompt": "hi", "best_of": 2}, "best_of"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
        ("/generate", {"text": "hi", "sampling_params": {"min_p": 3}}, "min_p"),
        ("/v1/completions", {"prompt": "hi", "no_repeat_ngram_size": -1},
         "no_repeat_ngram_size"),
        ("/generate", {"text": "hi", "sampling_params": {"no_repeat_ngram_size": -2}},
         "no_repeat_ngram_size"),
        # With main's checks: unknown fields are still refused by name next to the sampling
        # fields, and a bad grammar next to logprobs and n names the grammar's field.
        ("/v1/completions", {"prompt": "hi", "logprobs": 1, "temprature": 0.5}, "temprature"),
        ("/v1/completions", {"prompt": "hi", "min_p": 0.1, "suffix": "x"}, "suffix"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                                  "logprobs": True, "response_format": {"type": "xml"}},
         "response_format"),
    ],
)  # fmt: skip
def test_bad_values_are_400_naming_the_field(http, path: str, body: dict, field: str) -> None:
    # /v1 bodies name the model (a missing one is a 400 of its own).
    r = http.post(path, json=body if path == "/generate" else {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
