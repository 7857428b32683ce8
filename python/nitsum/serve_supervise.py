"""What `nitsum serve` watches once it started its children: each router's `/health`, and the
children themselves (restarting whoever exits, with backoff), until a signal.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from nitsum.serve_commands import ServeError, without_kv_transport
from nitsum.worker.children import Children
from nitsum.worker.supervise import Restarts

log = logging.getLogger("nitsum.serve")


def check_port_free(host: str, port: int) -> None:
    """ServeError when something already listens on host:port: its /health would fool us."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServeError(f"cannot use {host}:{port} ({e.strerror}); pick another --port") from e


def get_health(base_url: str, timeout: float = 2.0) -> tuple[int, dict] | None:
    """(status, JSON body) of GET /health; None while nothing answers.

    NOTE: over HTTPS (`--ssl-certfile`) the certificate is not checked: this polls the router
    `nitsum serve` itself started, on its own address, whose certificate may name another host.
    """
    context = ssl._create_unverified_context() if base_url.startswith("https:") else None
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout, context=context) as r:
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


def wait_for(what: str, children: Children, timeout: float, ready: Callable[[], object]) -> None:
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


def supervise(
    children: Children,
    workers: dict[str, list[str]],
    routers: dict[str, list[str]],
    env: dict[str, str],
    args: argparse.Namespace,
    urls: dict[str, str],
) -> None:
    """Keep the routers and the workers running until a signal: restart whoever exits (with
    backoff, supervise.py) unless told not to.

    NOTE: a restarted router keeps its command line, address and worker secret, so the live
    workers reconnect to it and register again by themselves (worker/link.py) and abort what
    the dead router had sent them (worker/registration.py); a restarted worker registers afresh.
    With several routers one that is not restarted leaves the others serving (and planning).
    """
    restarts = Restarts()
    for who in (*workers, *routers):
        restarts.started(who)
    reported: set[str] = set()
    waiting: set[str] = set()  # restarted routers not yet serving every worker
    gone: set[str] = set()
    while True:
        for who, code in children.exited():
            if who in routers and not args.restart_router:
                gone.add(who)
                if gone == set(routers):
                    raise ServeError(f"the router exited with code {code}")
                log.error("%s exited with code %s; the other routers serve", who, code)
            elif who in routers or args.restart_workers:
                restarts.exited(who, code)
            elif who not in reported:  # the router retries its requests (docs/protocol.md)
                log.error("%s exited with code %s; serving with the others", who, code)
                reported.add(who)
        for who in restarts.due():
            cmd = routers[who] if who in routers else without_kv_transport(workers[who])
            children.spawn(who, cmd, env=env)
            restarts.started(who)
            if who in routers:
                waiting.add(who)
        for who in list(waiting):
            if workers_ready(get_health(urls[who], timeout=0.5), args.workers):
                log.info("the restarted %s serves %d workers again", who, args.workers)
                waiting.discard(who)
        time.sleep(0.2)
