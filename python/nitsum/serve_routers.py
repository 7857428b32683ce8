"""`nitsum serve --routers N`: N routers in front of one worker pool (docs/architecture.md §4,
"Several routers"; docs/deployment.md "Several routers").

Router i listens on `--port + i` and takes workers on the `--worker-addr` port + i; they share
one planning lease (an flock on a file in a run directory of this `nitsum serve`, or
`--router-lease etcd:URL`), so one of them plans and the others follow its plan; every worker
registers with every router. A load balancer in front spreads clients over the N ports
(docs/serving.md, "Several routers behind a load balancer").
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from nitsum.serve_commands import ServeError


def router_names(n: int) -> list[str]:
    """The children's names: `router` alone, `router0..N-1` with several."""
    return ["router"] if n == 1 else [f"router{i}" for i in range(n)]


def router_ports(port: int, n: int) -> list[int]:
    """Consecutive HTTP ports from `port`."""
    if port + n - 1 > 65535:
        raise ServeError(f"--port {port} with --routers {n} runs past port 65535")
    return [port + i for i in range(n)]


def worker_addrs(worker_addr: str, n: int) -> list[str]:
    """Each router's worker endpoint: `worker_addr`, then its port + 1, + 2, ..."""
    if n == 1:
        return [worker_addr]
    m = re.fullmatch(r"tcp://(.+):(\d+)", worker_addr)
    if m is None:
        raise ServeError(
            f"--routers {n} takes workers on consecutive ports from a tcp://HOST:PORT "
            f"--worker-addr, not {worker_addr!r}"
        )
    host, port = m.group(1), int(m.group(2))
    if port + n - 1 > 65535:
        raise ServeError(f"--worker-addr {worker_addr} with --routers {n} runs past port 65535")
    return [f"tcp://{host}:{port + i}" for i in range(n)]


def lease_flags(
    args: argparse.Namespace, index: int, run_dir: Path, worker_addr: str | None = None
) -> list[str]:
    """Router `index`'s flags for the shared lease (none for a lone router without one).

    NOTE: followers reach the leader at its worker endpoint; a wildcard one (tcp://0.0.0.0:P)
    names no host, so the routers of one `nitsum serve` then meet on loopback (--peer-addr)."""
    if args.routers == 1 and args.router_lease is None:
        return []
    lease = args.router_lease or f"file:{run_dir / 'lease'}"
    flags = ["--router-index", str(index), "--lease", lease]
    m = re.fullmatch(r"tcp://(0\.0\.0\.0|\*|\[::\]):(\d+)", worker_addr or "")
    if m is not None:
        flags += ["--peer-addr", f"tcp://127.0.0.1:{m.group(2)}"]
    return flags


def check_routers(args: argparse.Namespace) -> list[str]:
    """What `--routers` / `--router-lease` cannot serve with (empty: fine)."""
    errors = []
    if args.routers < 1:
        errors.append("--routers must be >= 1")
    lease = args.router_lease
    if lease is not None and not (lease.startswith("file:") or lease.startswith("etcd:http://")):
        errors.append(f"--router-lease {lease!r}: expected file:PATH or etcd:http://HOST:PORT")
    if args.routers > 1 and args.kv_transport:
        errors.append("--kv-transport serves one router; drop it or --routers")
    return errors
