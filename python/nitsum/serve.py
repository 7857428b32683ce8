"""`nitsum serve`: start the router and N device workers, wait until they are ready, serve.

The router runs its control loop (the planner every window) when a profile describes the
model: `--profile`, the config's, or a measured one found for the model (the shipped CPU
profile for the embedded model; see control_profile.py); `--no-control` turns it off.

With `--tp-switching` (the default with the control loop on CPU) the N devices are served by
ONE host worker process (`nitsum worker --devices N`) that switches TP levels and hands
prefilled KV to decode groups when the router sends `reconfigure`; with `--no-tp-switching`,
N single-device TP-1 worker processes.

Startup: resolve the model directory (converting the embedded GGUF on first use), start the
router, wait for its `/health` to answer at all (503 "no_workers" counts: the HTTP server is
up), start the workers, then poll `/health` until its JSON reports `workers >= N`. Ctrl-C or
SIGTERM is forwarded to every child; no child outlives this process (see worker/children.py).
The router and its workers share a fresh random worker secret (`NITSUM_WORKER_SECRET` in their
environment) that workers authenticate with (docs/security.md). See docs/serving.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from nitsum.control_profile import (
    ControlConfigError,
    choose_control_profile,
    config_profile,
    read_json,
)
from nitsum.parallel.shift import ShiftRule
from nitsum.ports import free_port
from nitsum.serve_binding import resolve_binding
from nitsum.serve_commands import (
    API_KEYS_ENV,
    ServeError,
    host_worker_command,
    resolve_router,
    router_command,
    without_kv_transport,
    worker_command,
)
from nitsum.serve_flags import build_parser, resolve_dtype, resolve_flags
from nitsum.serve_kv_sizing import kv_sizing
from nitsum.worker.children import Children
from nitsum.worker.protocol import SECRET_ENV
from nitsum.worker.supervise import Restarts

log = logging.getLogger("nitsum.serve")


def profile_shift_rule(profile: Path | str | None) -> ShiftRule | None:
    """The shift rule a measured profile's crossovers give (None: no profile, an unreadable
    one (the router reports it) or one without crossovers; a malformed one is logged)."""
    data = read_json(Path(profile).expanduser()) if profile else None
    try:
        return ShiftRule.from_profile(data) if data else None
    except ValueError as e:
        log.warning("profile %s: %s; the worker's default shift threshold is used", profile, e)
        return None


def check_port_free(host: str, port: int) -> None:
    """ServeError when something already listens on host:port: its /health would fool us."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServeError(f"cannot use {host}:{port} ({e.strerror}); pick another --port") from e


def get_health(base_url: str, timeout: float = 2.0) -> tuple[int, dict] | None:
    """(status, JSON body) of GET /health; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:  # 503 "no_workers" is an answer too
        status, body = e.code, e.read()
    except (urllib.error.URLError, OSError):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    return status, data if isinstance(data, dict) else {}


def workers_ready(health: tuple[int, dict] | None, n: int) -> bool:
    """Whether /health reports `n` workers (a body without `workers`: 200 means ready)."""
    if health is None:
        return False
    status, data = health
    if isinstance(data.get("workers"), int):
        return data["workers"] >= n
    return status == 200


class _Stop(Exception):
    """Raised in the main thread by the signal handler."""


def _wait(what: str, children: Children, timeout: float, ready: Callable[[], object]) -> None:
    """Poll `ready` every 200 ms; fail early when a child exits."""
    deadline = time.monotonic() + timeout
    while not ready():
        dead = children.exited()
        if dead:
            name, code = dead[0]
            raise ServeError(f"{name} exited with code {code} while waiting for {what}")
        if time.monotonic() > deadline:
            raise ServeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def use_host_worker(
    flag: bool | None, control: bool, device: str, workers: int, devices_per_gpu: int = 1
) -> bool:
    """Whether one host worker serves every device (`--tp-switching`).

    Default (flag None): with the control loop on CPU and more than one device, because only
    devices of one worker process can form a TP group or hand prefilled KV to a decode group;
    with separate processes every plan is TP-1 groups without a P/D split. Several devices
    per GPU are there to form groups: one host worker too.
    """
    if flag is not None:
        return flag
    return (control and device == "cpu" and workers > 1) or devices_per_gpu > 1


def _supervise(
    children: Children,
    workers: dict[str, list[str]],
    router: list[str],
    env: dict[str, str],
    args: argparse.Namespace,
    url: str,
) -> None:
    """Keep the router and the workers running until a signal: restart whoever exits (with
    backoff, supervise.py) unless told not to.

    NOTE: a restarted router keeps its command line, address and worker secret, so the live
    workers reconnect to it and register again by themselves (worker/link.py) and abort what
    the dead router had sent them (worker/registration.py); a restarted worker registers afresh.
    """
    restarts = Restarts()
    for who in (*workers, "router"):
        restarts.started(who)
    reported: set[str] = set()
    waiting_for_workers = False
    while True:
        for who, code in children.exited():
            if who == "router" and not args.restart_router:
                raise ServeError(f"the router exited with code {code}")
            if who == "router" or args.restart_workers:
                restarts.exited(who, code)
            elif who not in reported:  # the router retries its requests (docs/protocol.md)
                log.error("%s exited with code %s; serving with the others", who, code)
                reported.add(who)
        for who in restarts.due():
            cmd = router if who == "router" else without_kv_transport(workers[who])
            children.spawn(who, cmd, env=env)
            restarts.started(who)
            waiting_for_workers |= who == "router"
        if waiting_for_workers and workers_ready(get_health(url, timeout=0.5), args.workers):
            log.info("the restarted router serves %d workers again", args.workers)
            waiting_for_workers = False
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    """Run until SIGINT/SIGTERM (or the router exits, with --no-restart-router); 0 on a clean
    stop, 1 or 2 on failure."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s %(message)s")
    errors = resolve_flags(args)
    if args.workers < 1:
        errors.append("--workers must be >= 1")
    if errors:
        for error in errors:
            print(f"nitsum serve: {error}", file=sys.stderr)
        return 2
    try:
        from nitsum.engine.load import resolve_model_dir

        model_dir = resolve_model_dir(args.model)
        prefix = resolve_router(args.router_bin)
        check_port_free(args.host, args.port)
        choice = choose_control_profile(
            model_dir, args.device, args.profile, args.control, args.config
        )
        args.dtype = resolve_dtype(args.dtype, args.device, model_dir)
        kv_sizing(args, model_dir)
    except (ServeError, ControlConfigError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"nitsum serve: {e}", file=sys.stderr)
        return 2
    for level, message in choice.messages:
        log.log(level, "%s", message)
    if errors := resolve_binding(args, choice):
        for error in errors:
            print(f"nitsum serve: {error}", file=sys.stderr)
        return 2
    if args.shift_threshold is None:
        args.shift_threshold = profile_shift_rule(choice.profile or config_profile(args.config))
    host_worker = use_host_worker(
        args.tp_switching, choice.control, args.device, args.workers, args.devices_per_gpu
    )
    # NOTE: only the devices of one host worker can form a TP group.
    host_worker |= (args.tensor_parallel_size or 1) > 1
    if host_worker and args.tp_switching is None:
        log.info(
            "one host worker serves the %d devices: the plan can change TP levels and split "
            "prefill/decode (--no-tp-switching: one worker process per device)",
            args.workers,
        )
    if args.kv_transport and host_worker:
        print(
            "nitsum serve: --kv-transport joins worker processes; one host worker serves "
            "every device here and hands KV between them itself (use --no-tp-switching)",
            file=sys.stderr,
        )
        return 2
    args.kv_peers_addr = f"tcp://127.0.0.1:{free_port()}" if args.kv_transport else None
    names = args.served_model_name or [model_dir.name]
    name = names[0]
    url = f"http://{'127.0.0.1' if args.host == '0.0.0.0' else args.host}:{args.port}"
    children = Children(grace_s=args.stop_timeout)
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        raise _Stop

    # NOTE: a fresh worker secret per run, for this router and its own workers only; passed in
    # the environment, never on a command line that `ps` shows (docs/security.md). The API
    # keys travel the same way.
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
    if args.api_keys:
        env[API_KEYS_ENV] = "\n".join(args.api_keys)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rcmd = router_command(
            prefix,
            args.host,
            args.port,
            args.worker_addr,
            model_dir,
            names,
            args.config,
            str(choice.profile) if choice.profile else None,
            args,
        )
        children.spawn("router", rcmd, env=env)
        _wait("the router's /health", children, args.startup_timeout, lambda: get_health(url))
        workers = (
            {"host-worker": host_worker_command(model_dir, args.worker_addr, name, args)}
            if host_worker
            else {
                f"worker{i}": worker_command(i, model_dir, args.worker_addr, name, args)
                for i in range(args.workers)
            }
        )
        for who, cmd in workers.items():
            children.spawn(who, cmd, env=env)
        _wait(
            f"{args.workers} workers to register",
            children,
            args.startup_timeout,
            lambda: workers_ready(get_health(url), args.workers),
        )
        print(f"nitsum serve: {name} ready at {url}/v1 ({args.workers} workers)", flush=True)
        _supervise(children, workers, rcmd, env, args, url)
    except _Stop:
        log.info("signal %d: stopping", received[0])
        return 0
    except ServeError as e:
        print(f"nitsum serve: {e}", file=sys.stderr)
        return 1
    finally:
        # stop() must not be interrupted; it is bounded (grace period, then SIGKILL).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        children.stop(received[0] if received else signal.SIGTERM)
        for s, h in old.items():
            signal.signal(s, h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
