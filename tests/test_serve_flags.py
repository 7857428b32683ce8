"""`nitsum serve`'s vLLM flags at the parse level: what each one turns into (the router's and
the workers' command lines, the environment), and the clear refusals. End-to-end effects are
in test_serve_vllm_flags.py."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from nitsum import serve_commands as sc
from nitsum import serve_kv_sizing
from nitsum.serve_flags import build_parser, resolve_dtype, resolve_flags
from nitsum.serve_kv_sizing import kv_cache_mb_for


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def model_dir(tmp_path: Path, torch_dtype: str | None = None) -> Path:
    d = tmp_path / "tiny"
    d.mkdir(exist_ok=True)
    d.joinpath("config.json").write_text(
        "{}" if torch_dtype is None else f'{{"torch_dtype": "{torch_dtype}"}}'
    )
    return d


def test_abbreviations_are_off_so_tp_is_not_tp_switching(capsys):
    with pytest.raises(SystemExit) as e:
        parse("--tp", "1")
    assert e.value.code == 2
    assert "unrecognized arguments: --tp" in capsys.readouterr().err
    assert parse("-tp", "1").tensor_parallel_size == 1
    assert parse("--tensor-parallel-size", "1").tensor_parallel_size == 1


def test_tensor_parallel_size_reaches_the_router_and_needs_a_host_worker():
    args = parse("--workers", "4", "--tensor-parallel-size", "2")
    assert resolve_flags(args) == []
    cmd = sc.router_command(["r"], "h", 1, "tcp://x", Path("/m"), ["m"], args=args)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert resolve_flags(parse("--workers", "1", "-tp", "3"))[0].startswith(
        "--tensor-parallel-size 3 needs at least 3 --workers"
    )
    assert resolve_flags(parse("--workers", "2", "-tp", "2", "--no-tp-switching")) == [
        "--tensor-parallel-size 2 needs one host worker for the devices of a group "
        "(drop --no-tp-switching)"
    ]


def test_positional_model_and_model_flag(tmp_path):
    args = parse(str(tmp_path))
    assert resolve_flags(args) == [] and args.model == str(tmp_path)
    args = parse()
    assert resolve_flags(args) == [] and args.model == "default"
    args = parse("a-model", "--model", "b-model")
    assert resolve_flags(args) == ["two models: 'a-model' and --model 'b-model'; give one"]


def test_api_keys_are_repeatable_and_reach_the_router_in_its_environment_only():
    args = parse("--api-key", "k1", "--api-key", "k2")
    assert args.api_keys == ["k1", "k2"]
    cmd = sc.router_command(["r"], "127.0.0.1", 8, "tcp://x", Path("/m"), ["m"], args=args)
    assert not any("k1" in a or "k2" in a for a in cmd)
    assert sc.API_KEYS_ENV == "NITSUM_API_KEYS"  # config.rs reads the same name


def test_open_host_without_api_keys_warns_loudly(caplog):
    with caplog.at_level(logging.WARNING, logger="nitsum.serve"):
        assert resolve_flags(parse("--host", "0.0.0.0")) == []
    assert "WITHOUT API keys" in caplog.text and "0.0.0.0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nitsum.serve"):
        resolve_flags(parse("--host", "0.0.0.0", "--api-key", "k"))
        resolve_flags(parse("--host", "127.0.0.1"))
    assert caplog.text == ""


def test_several_served_model_names_become_the_name_and_aliases():
    args = parse("--served-model-name", "a", "b", "c")
    assert args.served_model_name == ["a", "b", "c"]
    cmd = sc.router_command(["r"], "h", 1, "tcp://x", Path("/m"), args.served_model_name)
    assert cmd[cmd.index("--served-model-name") + 1] == "a"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--model-alias"] == ["b", "c"]


def test_engine_flags_reach_every_worker(tmp_path):
    d = model_dir(tmp_path)
    args = parse(
        "--workers", "2", "--max-model-len", "64", "--max-num-seqs", "2",
        "--no-enable-prefix-caching",
    )  # fmt: skip
    assert args.max_batch == 2
    for cmd in (
        sc.worker_command(1, d, "tcp://x", "m", args),
        sc.host_worker_command(d, "tcp://x", "m", args),
    ):
        assert cmd[cmd.index("--max-context") + 1] == "64"
        assert cmd[cmd.index("--max-batch") + 1] == "2"
        assert "--no-prefix-caching" in cmd
        assert cmd[cmd.index("--dtype") + 1] == "float32"  # auto on CPU
    plain = sc.worker_command(0, d, "tcp://x", "m", parse())
    assert "--max-context" not in plain and "--no-prefix-caching" not in plain
    with pytest.raises(SystemExit):
        parse("--max-num-seqs", "0")


def test_the_worker_parser_takes_what_serve_passes(tmp_path):
    from nitsum.worker.__main__ import build_parser as worker_parser

    args = parse("--max-model-len", "64", "--no-enable-prefix-caching", "--max-num-seqs", "3")
    cmd = sc.worker_command(0, model_dir(tmp_path), "tcp://x", "m", args)
    w = worker_parser().parse_args(cmd[3:])
    assert (w.max_context, w.prefix_caching, w.max_batch) == (64, False, 3)
    assert worker_parser().parse_args(["--worker-id", "0"]).prefix_caching is True


def test_dtype_auto(tmp_path):
    assert resolve_dtype("auto", "cpu", model_dir(tmp_path, "bfloat16")) == "float32"
    assert resolve_dtype("auto", "cuda", model_dir(tmp_path, "float16")) == "float16"
    assert resolve_dtype("auto", "cuda", model_dir(tmp_path)) == "bfloat16"  # names none
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"torch_dtype": "float64"}')
    assert resolve_dtype("auto", "cuda", other) == "bfloat16"
    assert resolve_dtype("bfloat16", "cpu", other) == "bfloat16"
    assert parse("--dtype", "auto").dtype == "auto"


def test_chat_template_must_be_a_file_and_reaches_the_router(tmp_path):
    assert resolve_flags(parse("--chat-template", str(tmp_path / "nope.jinja"))) == [
        f"--chat-template {tmp_path / 'nope.jinja'}: no such file"
    ]
    t = tmp_path / "t.jinja"
    t.write_text("{{ messages[0]['content'] }}")
    args = parse("--chat-template", str(t))
    assert resolve_flags(args) == []
    cmd = sc.router_command(["r"], "h", 1, "tcp://x", Path("/m"), ["m"], args=args)
    assert cmd[cmd.index("--chat-template") + 1] == str(t.resolve())


def test_gpu_memory_utilization_sizes_kv_and_is_cuda_only():
    gib = 1 << 30
    # 80 GiB device, 1 GiB used by others, 16 GiB of weights, 0.9: 72 - 1 - 16 - 2 = 53 GiB.
    assert kv_cache_mb_for(80 * gib, gib, 16 * gib, 0.9) == 53 * 1024
    with pytest.raises(ValueError, match="no room for KV"):
        kv_cache_mb_for(16 * gib, 0, 15 * gib, 0.9)
    assert resolve_flags(parse("--gpu-memory-utilization", "0.9")) == [
        "--gpu-memory-utilization sizes KV on CUDA only (--device cuda)"
    ]
    assert resolve_flags(parse("--device", "cuda", "--gpu-memory-utilization", "0.9")) == []
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            parse("--gpu-memory-utilization", bad)


def test_an_hf_repo_id_resolves_from_the_local_cache_or_says_how_to_get_it(tmp_path, monkeypatch):
    from nitsum.engine.load import resolve_model_dir

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache") as e:
        resolve_model_dir("acme/tiny-chat")
    assert "huggingface-cli download acme/tiny-chat" in str(e.value) and str(hub) in str(e.value)
    snap = hub / "models--acme--tiny-chat" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (hub / "models--acme--tiny-chat" / "refs").mkdir()
    (hub / "models--acme--tiny-chat" / "refs" / "main").write_text("abc123\n")
    assert resolve_model_dir("acme/tiny-chat") == snap
    # The positional form reaches the same place.
    args = parse("acme/tiny-chat")
    assert resolve_flags(args) == [] and resolve_model_dir(args.model) == snap


def test_kv_pool_default_is_512_mib_on_cpu_and_a_memory_share_on_cuda(monkeypatch, tmp_path):
    """Without --kv-cache-mb a CPU worker gets 512 MiB and a CUDA one the pool that fills
    0.9 of its device (vLLM's default), computed from the device's memory and the weights."""
    args = parse()
    serve_kv_sizing.kv_sizing(args, tmp_path)
    assert args.kv_cache_mb == serve_kv_sizing.CPU_KV_CACHE_MB == 512
    args = parse("--kv-cache-mb", "100")
    serve_kv_sizing.kv_sizing(args, tmp_path)
    assert args.kv_cache_mb == 100

    gib = 1 << 30
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=0: (79 * gib, 80 * gib))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    args = parse("--device", "cuda")
    serve_kv_sizing.kv_sizing(args, tmp_path)
    assert args.gpu_memory_utilization == 0.9
    assert args.kv_cache_mb == kv_cache_mb_for(80 * gib, gib, 1024, 0.9)
    # Given, it wins on CUDA too.
    args = parse("--device", "cuda", "--kv-cache-mb", "30000")
    serve_kv_sizing.kv_sizing(args, tmp_path)
    assert args.kv_cache_mb == 30000 and args.gpu_memory_utilization is None


def test_the_cuda_default_says_so_when_the_device_is_too_full(monkeypatch, tmp_path):
    gib = 1 << 30
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=0: (10 * gib, 80 * gib))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    with pytest.raises(ValueError, match="that is the CUDA default: give --kv-cache-mb"):
        serve_kv_sizing.kv_sizing(parse("--device", "cuda"), tmp_path)
    with pytest.raises(ValueError, match="no room for KV") as e:
        serve_kv_sizing.kv_sizing(
            parse("--device", "cuda", "--gpu-memory-utilization", "0.9"), tmp_path
        )
    assert "CUDA default" not in str(e.value)


def test_devices_per_gpu_makes_one_gpu_a_pool_of_k_devices(monkeypatch, tmp_path):
    """--devices-per-gpu K: K device processes on the one visible GPU, one host worker for
    them, the GPU's memory split K ways; refused where it cannot run."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = parse("--device", "cuda", "--devices-per-gpu", "4")
    assert resolve_flags(args) == [] and args.workers == 4  # every slot of the one GPU
    d = model_dir(tmp_path)
    cmd = sc.host_worker_command(d, "tcp://x", "m", args)
    assert cmd[cmd.index("--devices") + 1] == "4"
    assert cmd[cmd.index("--devices-per-gpu") + 1] == "4"
    for i, gpu in ((0, "cuda:0"), (3, "cuda:0")):
        one = sc.worker_command(i, d, "tcp://x", "m", args)
        assert one[one.index("--device") + 1] == gpu
    args = parse("--device", "cuda", "--devices-per-gpu", "4", "--workers", "3")
    assert resolve_flags(args) == [] and args.workers == 3  # as given
    assert resolve_flags(parse("--device", "cuda", "--devices-per-gpu", "2", "--workers", "5")) == [
        "--workers 5 with --devices-per-gpu 2: 2 device slots"
    ]
    # A pool over two GPUs would mix kinds of collectives: one GPU, or one process per GPU.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_flags(parse("--device", "cuda", "--devices-per-gpu", "2")) == [
        "--devices-per-gpu makes one GPU a pool of devices: 2 are visible "
        "(CUDA_VISIBLE_DEVICES=N picks one)"
    ]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_flags(parse("--devices-per-gpu", "2")) == [
        "--devices-per-gpu shares a GPU between device processes (--device cuda)"
    ]
    errors = resolve_flags(
        parse("--device", "cuda", "--devices-per-gpu", "2", "--collectives", "dist")
    )
    assert errors == [
        "--collectives: 2 device processes per GPU need shared collectives: NCCL refuses two "
        "ranks on one GPU"
    ]
    with pytest.raises(SystemExit):
        parse("--devices-per-gpu", "0")
    # The worker takes what serve passes, into its engine config.
    from nitsum.worker.__main__ import build_parser as worker_parser
    from nitsum.worker.__main__ import engine_config

    w = worker_parser().parse_args(cmd[3:])
    assert (w.devices, w.devices_per_gpu) == (4, 4)
    assert engine_config(w).devices_per_gpu == 4
    # Four devices with their weights and reserve share the 80 GiB: 72 - 1 - 4 x 18 < 0.
    gib = 1 << 30
    assert kv_cache_mb_for(80 * gib, gib, 2 * gib, 0.9, devices=4) == (71 - 16) * 1024 // 4
    with pytest.raises(ValueError, match=r"4 x \(weights 16384 MiB"):
        kv_cache_mb_for(80 * gib, gib, 16 * gib, 0.9, devices=4)


def test_several_routers_on_a_wildcard_worker_endpoint_meet_on_loopback(tmp_path):
    """Followers reach the leader at its worker endpoint; tcp://0.0.0.0:P names no host, so
    `nitsum serve --routers N` gives each router a loopback --peer-addr of its own port."""
    from nitsum.serve_routers import lease_flags, worker_addrs

    args = parse("--routers", "2", "--worker-addr", "tcp://0.0.0.0:6000")
    addrs = worker_addrs(args.worker_addr, args.routers)
    flags = [lease_flags(args, i, tmp_path, a) for i, a in enumerate(addrs)]
    assert [f[f.index("--peer-addr") + 1] for f in flags] == [
        "tcp://127.0.0.1:6000",
        "tcp://127.0.0.1:6001",
    ]
    named = parse("--routers", "2", "--worker-addr", "tcp://10.1.2.3:6000")
    assert "--peer-addr" not in lease_flags(named, 0, tmp_path, "tcp://10.1.2.3:6000")
