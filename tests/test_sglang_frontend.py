"""SGLang's frontend language (`sgl.RuntimeEndpoint`) against the real `nitsum-router` and a
real worker server over the echo backend: it connects (`/get_model_info`), generates through
`/generate` with the sampling params it always sends, and flushes the cache.

Skipped where the `sglang` package is absent. It installs without its CUDA kernels:
`pip install --no-deps sglang` plus the few pure-Python modules `sglang.lang` imports
(orjson, pybase64, starlette, msgspec, ipython, traitlets, aiohttp and its dependencies);
docs/serving.md has the line CI can run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plane import RealWorker, Router
from test_router_protocol import BIN

sgl = pytest.importorskip("sglang", reason="the sglang frontend package is not installed")
runtime_endpoint = pytest.importorskip("sglang.lang.backend.runtime_endpoint")

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]


@pytest.fixture()
def router(tmp_path: Path) -> Iterator[Router]:
    router = Router(tmp_path)
    worker = RealWorker(router)
    try:
        yield router
    finally:
        worker.stop()
        router.stop()


def test_runtime_endpoint_connects_generates_and_flushes(router: Router) -> None:
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
