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
environment) that workers authenticate with (docs/security.md). With `--routers N`, N routers
on consecutive ports share a planning lease and every worker registers with each
(serve_routers.py). See docs/serving.md.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
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
    worker_command,
)
from nitsum.serve_flags import build_parser, resolve_dtype, resolve_flags
from nitsum.serve_kv_sizing import kv_sizing
from nitsum.serve_launch_flags import https
from nitsum.serve_routers import (
    check_routers,
    lease_flags,
    router_names,
    router_ports,
    worker_addrs,
)
from nitsum.serve_supervise import (
    check_port_free,
    get_health,
    supervise,
    wait_for,
    workers_ready,
)
from nitsum.worker.children import Children
from nitsum.worker.protocol import SECRET_ENV

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


class _Stop(Exception):
    """Raised in the main thread by the signal handler."""


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


def main(argv: list[str] | None = None) -> int:
    """Run until SIGINT/SIGTERM (or the router exits, with --no-restart-router); 0 on a clean
    stop, 1 or 2 on failure."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s %(message)s")
    errors = resolve_flags(args) + check_routers(args)
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
        ports = router_ports(args.port, args.routers)
        for port in ports:
            check_port_free(args.host, port)
        addrs = worker_addrs(args.worker_addr, args.routers)
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
    host = "127.0.0.1" if args.host == "0.0.0.0" else args.host
    names_of = router_names(args.routers)
    scheme = "https" if https(args) else "http"
    urls = {who: f"{scheme}://{host}:{port}" for who, port in zip(names_of, ports, strict=True)}
    run_dir = Path(tempfile.mkdtemp(prefix="nitsum-serve-"))  # the routers' lease file
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
    profile = str(choice.profile) if choice.profile else None
    try:
        routers = {
            who: router_command(
                prefix, args.host, ports[i], addrs[i], model_dir, names, args.config, profile, args
            )
            + lease_flags(args, i, run_dir, addrs[i])
            for i, who in enumerate(names_of)
        }
        for who, rcmd in routers.items():
            children.spawn(who, rcmd, env=env)
        for who, url in urls.items():
            up = functools.partial(get_health, url)
            wait_for(f"the {who}'s /health", children, args.startup_timeout, up)
        # NOTE: every worker registers with every router (one DEALER per router).
        every = ",".join(addrs)
        workers = (
            {"host-worker": host_worker_command(model_dir, every, name, args)}
            if host_worker
            else {
                f"worker{i}": worker_command(i, model_dir, every, name, args)
                for i in range(args.workers)
            }
        )
        for who, cmd in workers.items():
            children.spawn(who, cmd, env=env)
        wait_for(
            f"{args.workers} workers to register",
            children,
            args.startup_timeout,
            lambda: all(workers_ready(get_health(u), args.workers) for u in urls.values()),
        )
        at = " ".join(f"{u}/v1" for u in urls.values())
        print(f"nitsum serve: {name} ready at {at} ({args.workers} workers)", flush=True)
        supervise(children, workers, routers, env, args, urls)
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
        shutil.rmtree(run_dir, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
