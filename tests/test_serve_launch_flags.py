"""`vllm serve`'s other launch flags (serve_launch_flags.py): each lands where it should on the
router's or the workers' command line, or stops `nitsum serve` by name with exit 2 before
anything starts. The router's side (TLS, root path) is in test_router_launch_flags.py."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest
import torch

from nitsum import serve
from nitsum import serve_commands as sc
from nitsum.sampling import SamplingParams
from nitsum.serve_flags import build_parser, resolve_flags
from nitsum.worker.__main__ import build_parser as worker_parser
from nitsum.worker.__main__ import engine_config

ROUTER = ["r"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def router_cmd(args: argparse.Namespace) -> list[str]:
    return sc.router_command(ROUTER, "h", 1, "tcp://x", Path("/m"), ["m"], args=args)


def after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--quantization", "awq"], "--quantization: Nitsum runs unquantized weights only"),
        (["--lora-modules", "a=/x"], "--lora-modules: Nitsum serves no LoRA adapters"),
        (["--speculative-config", "{}"], "--speculative-config: Nitsum has no speculative"),
        (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8: Nitsum keeps KV in the model's"),
        (["--no-enable-chunked-prefill"], "--no-enable-chunked-prefill: Nitsum always chunks"),
        (["-pp", "2"], "--pipeline-parallel-size 2: pipeline stages are the control loop's"),
        (["--block-size", "24"], "--block-size 24: must divide the router's 64-token"),
        (["--ssl-certfile", "/no/cert.pem"], "--ssl-certfile and --ssl-keyfile go together"),
        (["--tokenizer", "/no/such"], "--tokenizer /no/such: not a directory with tokenizer"),
        (["--generation-config", "/no/such"], "--generation-config /no/such: auto, vllm or"),
        (["--root-path", "api"], "--root-path api: must start with /"),
        (["-dp", "2", "--workers", "3"], "--data-parallel-size 2: 2 devices (DP x TP), but"),
    ],
)
def test_refused_by_name_with_exit_2_before_anything_starts(argv, message, capsys, monkeypatch):
    def must_not_start(*_a: object, **_k: object) -> None:
        raise AssertionError("started something")

    monkeypatch.setattr(serve, "resolve_router", must_not_start)
    assert serve.main(argv) == 2
    err = capsys.readouterr().err
    assert f"nitsum serve: {message}" in err, err


def test_every_listed_flag_parses():
    """None of issue 40's list is argparse's "unrecognized arguments"."""
    args = parse(
        *["--seed", "3", "--trust-remote-code", "--disable-log-requests", "--disable-log-stats"],
        *["--enable-chunked-prefill", "--max-num-batched-tokens", "256"],
        *["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        *["--reasoning-parser", "deepseek_r1", "--enforce-eager", "--tokenizer", "/t"],
        *["--generation-config", "vllm", "--block-size", "32", "--swap-space", "0.5"],
        *["--uvicorn-log-level", "warning", "--root-path", "/api", "--ssl-keyfile", "k"],
        *["--ssl-certfile", "c", "--pipeline-parallel-size", "1", "--data-parallel-size", "2"],
        *["--quantization", "awq", "--kv-cache-dtype", "auto", "--lora-modules", "x"],
        "--speculative-config",
        "{}",
    )
    assert (args.seed, args.block_size, args.swap_space) == (3, 32, 0.5)


def test_engine_flags_reach_every_worker(tmp_path):
    args = parse("--seed", "7", "--enforce-eager", "--block-size", "32")
    args.max_num_batched_tokens, args.swap_space = 256, 0.25
    assert resolve_flags(args) == []
    assert (args.token_budget, args.host_kv_cache_mb) == (256, 256)
    cmd = sc.worker_command(0, tmp_path, "tcp://x", "m", args)
    for built in (cmd, sc.host_worker_command(tmp_path, "tcp://x", "m", args)):
        assert after(built, "--seed") == "7" and "--enforce-eager" in built
        assert after(built, "--page-tokens") == "32"
        assert after(built, "--token-budget") == "256"
        assert after(built, "--host-kv-cache-mb") == "256"
    ecfg = engine_config(worker_parser().parse_args(cmd[3:]))
    assert (ecfg.seed, ecfg.page_tokens, ecfg.token_budget) == (7, 32, 256)
    assert ecfg.host_kv_cache_bytes == 256 << 20


def test_enforce_eager_records_no_steps_even_on_cuda():
    base = ["--worker-id", "0", "--device", "cuda:0"]
    assert engine_config(worker_parser().parse_args(base)).records_steps
    eager = engine_config(worker_parser().parse_args([*base, "--enforce-eager"]))
    assert not eager.records_decode and not eager.records_piecewise


def test_token_budget_twice_must_agree():
    args = parse("--max-num-batched-tokens", "256", "--token-budget", "512")
    assert resolve_flags(args) == ["--max-num-batched-tokens 256 and --token-budget differ"]


def test_data_parallel_size_sets_the_devices_as_dp_times_tp():
    args = parse("-dp", "2", "-tp", "3")
    assert resolve_flags(args) == [] and args.workers == 6
    args = parse("-dp", "2", "--workers", "2")
    assert resolve_flags(args) == [] and args.workers == 2


def test_router_flags_pass_through_under_the_router_names(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "generation_config.json").write_text("{}")
    (tmp_path / "c.pem").write_text("c")
    (tmp_path / "k.pem").write_text("k")
    args = parse(
        *["--root-path", "/api", "--uvicorn-log-level", "critical", "--disable-log-requests"],
        *["--ssl-certfile", str(tmp_path / "c.pem"), "--ssl-keyfile", str(tmp_path / "k.pem")],
        *["--tokenizer", str(tok), "--generation-config", str(gen)],
        *["--tool-call-parser", "pythonic", "--reasoning-parser", "qwen3"],
        "--enable-auto-tool-choice",
    )
    assert resolve_flags(args) == []
    cmd = router_cmd(args)
    assert after(cmd, "--root-path") == "/api"
    assert after(cmd, "--log-level") == "error"
    assert after(cmd, "--ssl-certfile") == str(tmp_path / "c.pem")
    assert after(cmd, "--ssl-keyfile") == str(tmp_path / "k.pem")
    assert after(cmd, "--tokenizer") == str(tok)
    assert after(cmd, "--generation-config") == str(gen)
    assert after(cmd, "--tool-call-parser") == "pythonic"
    assert after(cmd, "--reasoning-parser") == "qwen3"
    assert "--enable-auto-tool-choice" in cmd and "--disable-log-requests" in cmd
    assert after(router_cmd(parse("--generation-config", "vllm")), "--generation-config") == "vllm"
    plain = router_cmd(parse())
    assert not {"--root-path", "--log-level", "--generation-config", "--tokenizer"} & set(plain)


def test_no_op_flags_say_why_in_the_log(caplog):
    args = parse("--trust-remote-code", "--disable-log-stats", "--enable-chunked-prefill")
    args.pipeline_parallel_size, args.kv_cache_dtype = 1, "auto"
    with caplog.at_level(logging.INFO, logger="nitsum.serve"):
        assert resolve_flags(args) == []
    assert "--trust-remote-code: Nitsum runs no code from the model directory" in caplog.text
    assert "--disable-log-stats: Nitsum logs no periodic stats" in caplog.text


def draws(seed: int | None) -> list[int]:
    """Tokens a sampled (temperature 1, unseeded) request draws on a tiny engine built with
    `seed`; the global generator is disturbed first, as other work in a process would."""
    from nitsum.engine.request_spec import RequestSpec
    from structured_helpers import run, tiny_engine, tiny_llama

    hf = tiny_llama(vocab=512)
    torch.rand(97)
    engine = tiny_engine(hf, seed=seed)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    engine.add_request("r", [5, 6, 7, 8], RequestSpec(params))
    return run(engine)[0]["r"]


def test_seed_gives_each_device_the_same_draws():
    assert draws(11) == draws(11)
    assert draws(11) != draws(12)
