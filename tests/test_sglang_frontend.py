"""SGLang's frontend language (`sgl.RuntimeEndpoint`) against Nitsum.

- Over the real `nitsum-router` and a real worker server on the echo backend: it connects
  (`/get_model_info`), generates through `/generate` with the sampling params it always sends,
  and flushes the cache. Skipped where the `sglang` package is absent. It installs without its
  CUDA kernels (docs/serving.md has the line).
- `sgl.select` (issue 40 item 9) on `nitsum serve` with the embedded SmolLM2: the two requests
  it sends (the prefix alone with `max_new_tokens: 0`, then every choice appended, scored from
  `logprob_start_len` with no output) answer the model's log-softmax, checked against the HF
  model in this process; and, where `sglang` is installed, `sgl.select` itself picks the
  likelier choice.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from plane import RealWorker, Router
from test_openai_sampling import MODEL, hf, http, server, tok  # noqa: F401 (fixtures)
from test_router_protocol import BIN

pytestmark = pytest.mark.e2e

PREFIX = "The capital of France is"
CHOICES = [" Paris", " London", " a banana"]


def _sglang() -> tuple[ModuleType, ModuleType]:
    sgl = pytest.importorskip("sglang", reason="the sglang frontend package is not installed")
    return sgl, importlib.import_module("sglang.lang.backend.runtime_endpoint")


@pytest.fixture()
def router(tmp_path: Path) -> Iterator[Router]:
    if not BIN.exists():
        pytest.skip(f"{BIN} not built")
    router = Router(tmp_path)
    worker = RealWorker(router)
    try:
        yield router
    finally:
        worker.stop()
        router.stop()


def test_runtime_endpoint_connects_generates_and_flushes(router: Router) -> None:
    sgl, runtime_endpoint = _sglang()
    backend = runtime_endpoint.RuntimeEndpoint(router.http)
    assert backend.get_model_name() == str(Path(router.args[router.args.index("--model-dir") + 1]))

    @sgl.function
    def echo(s, prompt):  # type: ignore[no-untyped-def]
        s += prompt
        s += sgl.gen("out", max_tokens=5, temperature=0)

    # The echo backend answers a prompt with its own ids, cyclically.
    state = echo.run(prompt="abc", backend=backend)
    assert state["out"] == "abcab", state.text()
    assert state.text() == "abcabcab"
    # Two prompts at once go out as two requests; each gets its own answer.
    states = echo.run_batch([{"prompt": "xy"}, {"prompt": "q"}], backend=backend)
    assert [s["out"] for s in states] == ["xyxyx", "qqqqq"]
    backend.flush_cache()


def _ids(http: Any, text: str) -> list[int]:  # noqa: F811
    """The prompt's ids as `/generate` tokenizes a `text`."""
    r = http.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


@pytest.mark.slow
def test_selects_two_requests_answer_the_models_prompt_logprobs(http, tok, hf) -> None:  # noqa: F811
    # 1. The prefix alone, nothing generated: select reads its length.
    r = http.post("/generate", json={"text": PREFIX, "sampling_params": {"max_new_tokens": 0}})
    assert r.status_code == 200, r.text
    first = r.json()
    prefix_ids = _ids(http, PREFIX)
    assert (first["text"], first["output_ids"]) == ("", [])
    meta = first["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(prefix_ids), 0)
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    # 2. Every choice appended, scored from two tokens before the prefix's end (token healing).
    start = max(len(prefix_ids) - 2, 0)
    body = {
        "text": [PREFIX + c for c in CHOICES],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": start,
    }
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == len(CHOICES)
    means = []
    for choice, out in zip(CHOICES, outs, strict=True):
        ids = _ids(http, PREFIX + choice)
        with torch.no_grad():
            want = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        assert (out["text"], out["output_ids"]) == ("", [])
        meta = out["meta_info"]
        assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
        got = meta["input_token_logprobs"]
        assert [e[1] for e in got] == ids[start:], choice
        for i, (lp, tid, text) in zip(range(start, len(ids)), got, strict=True):
            assert lp == pytest.approx(float(want[i - 1, tid]), abs=1e-4), (choice, i)
            assert text == tok.decode([tid])
        means.append(sum(e[0] for e in got) / len(got))
    # select's default rule (the mean logprob) picks the model's likeliest continuation.
    assert CHOICES[means.index(max(means))] == " Paris", means
    # 3. The unconditional pass (input_ids, no logprob_start_len): SGLang's -1 is the last
    # prompt token, so its entry is there.
    ids = _ids(http, " Paris")
    body = {"input_ids": [ids], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    got = r.json()[0]["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in got] == ids[-1:]


@pytest.mark.slow
def test_sgl_select_picks_the_likelier_choice(server) -> None:  # noqa: F811
    sgl, runtime_endpoint = _sglang()
    backend = runtime_endpoint.RuntimeEndpoint(server.base)

    @sgl.function
    def capital(s):  # type: ignore[no-untyped-def]
        s += PREFIX
        s += sgl.select("city", choices=CHOICES)

    state = capital.run(backend=backend)
    assert state["city"] == " Paris", state.text()
    assert MODEL  # the served model the fixture started
