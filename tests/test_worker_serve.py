"""`nitsum serve` orchestration with a fake router executable and fake workers (subprocesses)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nitsum import serve, serve_commands, serve_kv_sizing
from nitsum.ports import free_port

ROOT = Path(__file__).resolve().parents[1]

FAKE_ROUTER = """
import argparse, json, os, sys, threading, zmq
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import msgpack
p = argparse.ArgumentParser()
for f in ("--router-index", "--lease", "--listen", "--worker-addr", "--model-dir",
          "--served-model-name", "--config"):
    p.add_argument(f)
a = p.parse_args()
a.host, a.port = a.listen.rsplit(":", 1)
out = os.environ["FAKE_OUT"]
secret = os.environ.get("NITSUM_WORKER_SECRET")
name = "router" if a.router_index is None else f"router{a.router_index}"
json.dump({"argv": sys.argv[1:], "pid": os.getpid(), "secret": secret},
          open(f"{out}/{name}.json", "w"))
workers = set()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok" if workers else "no_workers", "workers": len(workers)})
        self.send_response(200 if workers else 503); self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args): pass
threading.Thread(target=ThreadingHTTPServer((a.host, int(a.port)), H).serve_forever,
                 daemon=True).start()
sock = zmq.Context().socket(zmq.ROUTER); sock.bind(a.worker_addr)
while True:
    ident, frame = sock.recv_multipart()
    msg = msgpack.unpackb(frame)
    if msg["type"] == "register":
        workers.add(msg["worker_id"])
        sock.send_multipart([ident, msgpack.packb({"v": 1, "type": "registered",
                                                   "worker_id": msg["worker_id"], "epoch": 0})])
"""

# argv: worker id, router address, out dir, behaviour ("ok" | "stubborn" | "crash" | "hostN":
# a host worker registering ids wid..wid+N-1, one socket each)
FAKE_WORKER = """
import os, signal, sys, time, zmq, msgpack
wid, addr, out, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
open(f"{out}/worker{wid}.pid", "w").write(str(os.getpid()))
open(f"{out}/worker{wid}.secret", "w").write(os.environ.get("NITSUM_WORKER_SECRET", ""))
if mode == "crash":
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
ids = range(wid, wid + int(mode[4:])) if mode.startswith("host") else [wid]
socks = []
for one in addr.split(","):  # several routers: it registers with each
    for i in ids:
        s = zmq.Context.instance().socket(zmq.DEALER); s.setsockopt(zmq.IDENTITY, str(i).encode())
        s.connect(one)
        s.send(msgpack.packb({"v": 1, "type": "register", "worker_id": i}))
        socks.append(s)
while True:
    time.sleep(0.1)
"""

WRAPPER = """
import sys, nitsum.serve as s
fake, out, modes = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
s.worker_command = lambda i, d, addr, n, args: [sys.executable, fake, str(i), addr, out, modes[i]]
s.host_worker_command = lambda d, addr, n, args: [
    sys.executable, fake, "0", addr, out, f"host{args.workers}"]
sys.exit(s.main(sys.argv[4:]))
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_dead(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def launch(tmp_path):
    """Start `nitsum serve` (fake router, fake workers); kill everything left at teardown."""
    procs: list[subprocess.Popen] = []
    router = tmp_path / "fake-router"
    router.write_text(f"#!{sys.executable}\n{FAKE_ROUTER}")
    router.chmod(0o755)
    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_WORKER)
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    port = free_port()

    def start(modes: str, *extra: str) -> tuple[subprocess.Popen, int]:
        argv = ["--model", str(model), "--workers", str(len(modes.split(",")))]
        argv += ["--port", str(port), "--worker-addr", f"tcp://127.0.0.1:{free_port()}"]
        argv += ["--router-bin", str(router), "--stop-timeout", "1", *extra]
        env = {**os.environ, "FAKE_OUT": str(tmp_path), "PYTHONPATH": str(ROOT / "python")}
        cmd = [sys.executable, "-c", WRAPPER, str(worker), str(tmp_path), modes, *argv]
        err = (tmp_path / "serve.err").open("w")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        err.close()
        procs.append(proc)
        return proc, port

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    pids = [int(f.read_text()) for f in tmp_path.glob("*.pid")]
    for router_json in tmp_path.glob("router*.json"):
        pids.append(json.loads(router_json.read_text() or "{}").get("pid", 0))
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def read_ready_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if "ready at" in line or not line:
                return line
    raise TimeoutError("nitsum serve did not print its URL in time")


def child_pids(tmp: Path, n: int) -> list[int]:
    router = json.loads((tmp / "router.json").read_text())["pid"]
    return [router] + [int((tmp / f"worker{i}.pid").read_text()) for i in range(n)]


@pytest.mark.e2e
def test_serve_starts_router_then_workers_and_sigterm_leaves_no_orphans(launch, tmp_path):
    proc, port = launch("ok,stubborn", "--config", "tiers.toml")
    line = read_ready_line(proc)
    assert (
        line.strip() == f"nitsum serve: tiny-model ready at http://127.0.0.1:{port}/v1 (2 workers)"
    )
    status, health = serve.get_health(f"http://127.0.0.1:{port}")
    assert (status, health["workers"]) == (200, 2)
    argv = json.loads((tmp_path / "router.json").read_text())["argv"]
    assert argv[:2] == ["--listen", f"127.0.0.1:{port}"]
    assert argv[argv.index("--model-dir") + 1] == str(tmp_path / "tiny-model")
    assert argv[argv.index("--served-model-name") + 1] == "tiny-model"
    assert argv[-2:] == ["--config", "tiers.toml"]
    # One fresh worker secret for the router and its workers, in the environment only.
    secret = json.loads((tmp_path / "router.json").read_text())["secret"]
    assert secret and len(secret) == 64 and secret != os.environ.get("NITSUM_WORKER_SECRET")
    assert not any(secret in a for a in argv)
    for i in range(2):
        assert (tmp_path / f"worker{i}.secret").read_text() == secret
    pids = child_pids(tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    # worker1 ignores SIGTERM: it is killed after --stop-timeout.
    assert wait_dead(pids, timeout=2.0) == []


@pytest.mark.e2e
def test_serve_killed_by_sigkill_still_takes_its_children(launch, tmp_path):
    proc, _ = launch("ok,ok")
    assert "ready at" in read_ready_line(proc)
    pids = child_pids(tmp_path, 2)
    proc.kill()
    proc.wait(10)
    assert wait_dead(pids) == []


@pytest.mark.e2e
def test_a_router_killed_after_startup_is_restarted_with_the_same_command_and_secret(
    launch, tmp_path
):
    proc, port = launch("ok,ok")
    assert "ready at" in read_ready_line(proc)
    first = json.loads((tmp_path / "router.json").read_text())
    os.kill(first["pid"], signal.SIGKILL)

    def restarted() -> dict | None:
        now = json.loads((tmp_path / "router.json").read_text() or "{}")
        return now if now.get("pid", first["pid"]) != first["pid"] else None

    deadline = time.monotonic() + 15
    while (again := restarted()) is None:
        assert proc.poll() is None, (tmp_path / "serve.err").read_text()
        assert time.monotonic() < deadline, "the router was not restarted"
        time.sleep(0.1)
    assert (again["argv"], again["secret"]) == (first["argv"], first["secret"])
    deadline = time.monotonic() + 10
    while serve.get_health(f"http://127.0.0.1:{port}") is None:  # it answers on the same port
        assert time.monotonic() < deadline, "the restarted router does not answer"
        time.sleep(0.1)
    assert "router exited with code -9" in (tmp_path / "serve.err").read_text()
    pids = child_pids(tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert wait_dead(pids) == []


@pytest.mark.e2e
def test_no_restart_router_makes_serve_exit_with_its_router(launch, tmp_path):
    proc, _ = launch("ok", "--no-restart-router")
    assert "ready at" in read_ready_line(proc)
    os.kill(json.loads((tmp_path / "router.json").read_text())["pid"], signal.SIGKILL)
    assert proc.wait(15) == 1
    assert "the router exited with code -9" in (tmp_path / "serve.err").read_text()


@pytest.mark.e2e
def test_a_worker_dying_at_startup_fails_serve_cleanly(launch, tmp_path):
    proc, _ = launch("ok,crash", "--startup-timeout", "20")
    assert read_ready_line(proc) == ""  # EOF, no URL
    assert proc.wait(15) == 1
    assert wait_dead(child_pids(tmp_path, 2), timeout=2.0) == []
    err = (tmp_path / "serve.err").read_text()
    assert "worker1 exited with code 3 while waiting for 2 workers to register" in err


@pytest.mark.e2e
def test_tp_switching_starts_one_host_worker_for_all_devices(launch, tmp_path):
    proc, port = launch("ok,ok,ok", "--tp-switching")
    line = read_ready_line(proc)
    assert line.strip().endswith("(3 workers)")
    _, health = serve.get_health(f"http://127.0.0.1:{port}")
    assert health["workers"] == 3  # three worker ids registered ...
    assert [p.name for p in tmp_path.glob("worker*.pid")] == ["worker0.pid"]  # ... by one process
    pids = child_pids(tmp_path, 1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert wait_dead(pids, timeout=2.0) == []


@pytest.mark.e2e
def test_several_routers_on_consecutive_ports_share_a_lease_and_every_worker(launch, tmp_path):
    proc, port = launch("ok,ok", "--routers", "2")
    line = read_ready_line(proc)
    urls = [f"http://127.0.0.1:{port + i}" for i in range(2)]
    assert (
        line.strip() == f"nitsum serve: tiny-model ready at {urls[0]}/v1 {urls[1]}/v1 (2 workers)"
    )
    first = [json.loads((tmp_path / f"router{i}.json").read_text()) for i in range(2)]
    flag = lambda i, f: first[i]["argv"][first[i]["argv"].index(f) + 1]  # noqa: E731
    assert [flag(i, "--listen") for i in range(2)] == [f"127.0.0.1:{port + i}" for i in range(2)]
    zmq_port = int(flag(0, "--worker-addr").rsplit(":", 1)[1])
    assert flag(1, "--worker-addr") == f"tcp://127.0.0.1:{zmq_port + 1}"
    assert [flag(i, "--router-index") for i in range(2)] == ["0", "1"]
    lease = flag(0, "--lease")
    assert lease == flag(1, "--lease") and lease.startswith("file:")
    assert first[0]["secret"] == first[1]["secret"]
    # Every worker registered with both routers.
    for url in urls:
        assert serve.get_health(url)[1]["workers"] == 2
    # A router that dies is restarted alone, with its own command; the other serves on.
    os.kill(first[1]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while json.loads((tmp_path / "router1.json").read_text() or "{}").get("pid") in (
        None,
        first[1]["pid"],
    ):
        assert time.monotonic() < deadline, "router1 was not restarted"
        time.sleep(0.1)
    again = json.loads((tmp_path / "router1.json").read_text())
    assert again["argv"] == first[1]["argv"]
    assert json.loads((tmp_path / "router0.json").read_text())["pid"] == first[0]["pid"]
    pids = [first[0]["pid"], again["pid"]] + [
        int((tmp_path / f"worker{i}.pid").read_text()) for i in range(2)
    ]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert wait_dead(pids, timeout=2.0) == []
    assert not Path(lease.removeprefix("file:")).parent.exists(), "the run directory is left"


def test_host_worker_command():
    args = serve.build_parser().parse_args(
        ["--workers", "4", "--tp-switching", "--dtype", "bfloat16"]
    )
    serve_kv_sizing.kv_sizing(args, Path("/m"))  # as `nitsum serve` does before
    cmd = serve_commands.host_worker_command(Path("/m"), "tcp://x:1", "m", args)
    assert cmd[1:3] == ["-m", "nitsum.worker"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags == {
        "--model": "/m",
        "--worker-id": "0",
        "--devices": "4",
        "--router": "tcp://x:1",
        "--device": "cpu",
        "--served-model-name": "m",
        "--kv-cache-mb": "512",  # no --max-batch: the worker takes its device's default
        "--host-kv-cache-mb": "256",
        "--dtype": "bfloat16",
    }
    from nitsum.worker.__main__ import build_parser as worker_parser
    from nitsum.worker.__main__ import engine_config

    ecfg = engine_config(worker_parser().parse_args(cmd[3:]))
    assert ecfg.dtype is torch.bfloat16  # the flag reaches the engine, not only the parser
    assert (ecfg.kv_cache_bytes, ecfg.host_kv_cache_bytes) == (512 << 20, 256 << 20)
    assert (ecfg.max_batch, ecfg.device) == (64, "cpu")
    assert ecfg.device_step_timeout_s == 5.0  # the worker's default

    # A step deadline's floor given to `nitsum serve` reaches every worker's device pool.
    args = serve.build_parser().parse_args(["--workers", "2", "--device-step-timeout", "2.5"])
    serve_kv_sizing.kv_sizing(args, Path("/m"))
    cmd = serve_commands.host_worker_command(Path("/m"), "tcp://x:1", "m", args)
    assert dict(zip(cmd[3::2], cmd[4::2], strict=True))["--device-step-timeout"] == "2.5"
    assert engine_config(worker_parser().parse_args(cmd[3:])).device_step_timeout_s == 2.5


def test_router_resolution_and_command(tmp_path, monkeypatch):
    monkeypatch.setattr(serve_commands.shutil, "which", lambda _name: None)
    monkeypatch.setattr(serve_commands.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(serve_commands.importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(serve_commands.ServeError, match="cannot find the router.*--router-bin"):
        serve_commands.resolve_router(None)
    with pytest.raises(serve_commands.ServeError, match="not an executable file"):
        serve_commands.resolve_router(str(tmp_path / "nope"))
    beside = tmp_path / "nitsum-router"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert serve_commands.resolve_router(None) == [str(beside)]
    cmd = serve_commands.router_command(["r"], "0.0.0.0", 9, "tcp://x:1", Path("/m"), "m", None)
    assert cmd == [
        "r",
        "--listen",
        "0.0.0.0:9",
        "--worker-addr",
        "tcp://x:1",
        "--model-dir",
        "/m",
        "--served-model-name",
        "m",
    ]


def test_workers_ready_reads_the_health_body():
    assert not serve.workers_ready(None, 1)
    assert not serve.workers_ready((503, {"status": "no_workers", "workers": 0}), 1)
    assert not serve.workers_ready((200, {"workers": 1}), 2)
    assert serve.workers_ready((200, {"workers": 2}), 2)
    assert serve.workers_ready((200, {}), 2)  # a router without the count: 200 is all we get


@pytest.mark.e2e
def test_a_router_that_dies_at_startup_fails_serve(launch, tmp_path):
    dying = tmp_path / "fake-router"
    dying.write_text("#!/bin/sh\necho bad flag >&2\nexit 2\n")
    proc, _ = launch("ok")
    assert read_ready_line(proc) == ""
    assert proc.wait(15) == 1
    assert not list(tmp_path.glob("worker*.pid"))  # no worker was started
    err = (tmp_path / "serve.err").read_text()
    assert "bad flag" in err  # the router's own stderr is not swallowed
    assert "router exited with code 2 while waiting for the router's /health" in err


def test_a_busy_port_is_refused_before_starting_anything():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(serve_commands.ServeError, match=f"127.0.0.1:{port}.*--port"):
            serve.check_port_free("127.0.0.1", port)
    serve.check_port_free("127.0.0.1", port)  # free again


def test_bind_idle_reaches_the_host_worker_and_negative_host_kv_is_refused() -> None:
    from nitsum.worker.__main__ import build_parser as worker_parser

    args = serve.build_parser().parse_args(["--workers", "2", "--tp-switching", "--bind-idle"])
    cmd = serve_commands.host_worker_command(Path("/m"), "tcp://x:1", "m", args)
    assert cmd[-1] == "--bind-idle"
    worker = worker_parser().parse_args(["--model", "/m", *cmd[cmd.index("--worker-id") :]])
    assert worker.bind_idle and worker.host_kv_cache_mb == 256
    for parser in (serve.build_parser(), worker_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args(["--host-kv-cache-mb", "-1"])


def test_shift_threshold_reaches_the_host_worker(tmp_path: Path) -> None:
    """A flag wins; without one, the control profile's measured crossovers are passed; the
    worker parses either back into the same rule."""
    from nitsum.parallel.shift import ShiftRule
    from nitsum.worker.__main__ import build_parser as worker_parser

    def worker_rule(argv: list[str], profile: Path | None = None) -> ShiftRule:
        args = serve.build_parser().parse_args(["--workers", "4", "--tp-switching", *argv])
        if args.shift_threshold is None:
            args.shift_threshold = serve.profile_shift_rule(profile)
        cmd = serve_commands.host_worker_command(Path("/m"), "tcp://x:1", "m", args)
        worker = worker_parser().parse_args(["--model", "/m", *cmd[cmd.index("--worker-id") :]])
        return worker.shift_threshold

    assert worker_rule(["--shift-threshold", "off,4=32"]) == ShiftRule(None, {4: 32})
    profile = tmp_path / "p.json"
    profile.write_text('{"shift_threshold": {"2": 64, "4": null}}')
    assert worker_rule([], profile) == ShiftRule(by_size={2: 64, 4: None})
    assert worker_rule([]) == ShiftRule()  # no profile: the worker's default
    # An unreadable or malformed profile leaves the worker's default (the router reports it).
    assert worker_rule([], tmp_path / "missing.json") == ShiftRule()
    profile.write_text('{"shift_threshold": {"x": 3}}')
    assert worker_rule([], profile) == ShiftRule()
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--shift-threshold", "1=8"])


def test_a_bad_shift_threshold_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--shift-threshold", "1=8"])
    assert "group sizes start at 2" in capsys.readouterr().err


def test_kv_transport_joins_worker_processes_and_a_restart_runs_without_it(capsys) -> None:
    args = serve.build_parser().parse_args(["--workers", "3", "--kv-transport"])
    args.kv_peers_addr = "tcp://127.0.0.1:4242"
    cmd = serve_commands.worker_command(2, Path("/m"), "tcp://x:1", "m", args)
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert (flags["--kv-peers"], flags["--kv-rank"], flags["--kv-world"]) == (
        "tcp://127.0.0.1:4242",
        "2",
        "3",
    )
    from nitsum.worker.__main__ import build_parser as worker_parser

    parsed = worker_parser().parse_args(cmd[3:])
    assert (parsed.kv_peers, parsed.kv_rank, parsed.kv_world) == ("tcp://127.0.0.1:4242", 2, 3)
    restart = serve_commands.without_kv_transport(cmd)
    assert not set(restart) & {"--kv-peers", "--kv-rank", "--kv-world", "tcp://127.0.0.1:4242"}
    assert (
        restart
        == serve_commands.worker_command(2, Path("/m"), "tcp://x:1", "m", args)[: len(restart)]
    )
    # One host worker hands KV between its devices itself: the flag is refused, not ignored.
    code = serve.main(["--kv-transport", "--tp-switching", "--port", str(free_port())])
    assert code == 2
    assert "--kv-transport joins worker processes" in capsys.readouterr().err
