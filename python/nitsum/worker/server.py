"""The device-worker server: one DEALER socket to the router around one engine (TP 1).

One thread does everything: poll the socket, handle messages, run `engine.step()` while there
is work, stream `tokens`, and send `register` / `heartbeat` on their timers. See
docs/protocol.md for the messages and docs/serving.md for how it is launched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from nitsum.engine.engine import Engine
from nitsum.errors import InvalidRequestError
from nitsum.worker import protocol as proto
from nitsum.worker.assignment import Assignment, PlanRefused, assignment_for
from nitsum.worker.protocol import ProtocolError

log = logging.getLogger(__name__)


class WorkerServer:
    """Serves `engine` to the router at `router_addr` as worker `worker_id`.

    NOTE: every accepted `generate` ends in exactly one `tokens` message with a finish reason:
    `self.live` holds the accepted ids, and `_final` is the only place that removes one.
    """

    def __init__(
        self,
        engine: Engine,
        worker_id: int,
        router_addr: str,
        model_name: str,
        device: str = "cpu",
        tp_levels: tuple[int, ...] = (1,),
        register_every_s: float = 5.0,
        heartbeat_every_s: float = 0.5,
        idle_poll_ms: int = 50,
        context: zmq.Context | None = None,
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.router_addr = router_addr
        self.model_name = model_name
        self.device = device
        self.tp_levels = tp_levels
        self.register_every_s = register_every_s
        self.heartbeat_every_s = heartbeat_every_s
        self.idle_poll_ms = idle_poll_ms
        self.ctx = context or zmq.Context.instance()
        # The configured batch cap; a plan's `max_batch` may only lower it.
        self.max_batch = engine.scheduler.max_batch
        self.registered = False
        self.epoch = 0
        self.assignment = Assignment()  # this worker's part of the plan at `epoch`
        self.live: dict[str, int] = {}  # accepted request id -> prompt tokens
        self._stop = threading.Event()
        self._sock: zmq.Socket | None = None
        self._lost = False  # the connection dropped and has not come back yet
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "registered": self._on_registered,
            "generate": self._on_generate,
            "abort": self._on_abort,
            "reconfigure": self._on_reconfigure,
            "shutdown": lambda _msg: self._stop.set(),
        }

    def stop(self) -> None:
        """Ask the loop to exit (thread-safe); `run` returns within one poll interval."""
        self._stop.set()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until `shutdown` or `stop()`; closes the socket on the way out."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, str(self.worker_id).encode())
        sock.setsockopt(zmq.LINGER, 1000)  # flush the last tokens on exit, but never hang
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(self.router_addr)
        self._sock = sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        next_register = next_heartbeat = time.monotonic()
        log.info("worker %d connecting to %s", self.worker_id, self.router_addr)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if not self.registered and now >= next_register:
                    self._send(self._register_msg())
                    next_register = now + self.register_every_s
                if now >= next_heartbeat:
                    self._send(self._heartbeat_msg())
                    next_heartbeat = now + self.heartbeat_every_s
                timeout = 0 if self.engine.has_unfinished() else self.idle_poll_ms
                events = dict(poller.poll(timeout))
                if monitor in events and self._on_monitor(monitor):
                    next_register = time.monotonic()
                if sock in events:
                    self._drain(sock)
                if self.engine.has_unfinished() and not self._stop.is_set():
                    self._step()
            self._fail_all("worker shut down")
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close()
            self._sock = None
            log.info("worker %d stopped", self.worker_id)

    def _on_monitor(self, monitor: zmq.Socket) -> bool:
        """Track the connection; True when it came back (a restarted router: re-register)."""
        event = recv_monitor_message(monitor)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            log.warning("worker %d lost the router; will re-register", self.worker_id)
            self.registered = False
            self._lost = True
        elif event == zmq.EVENT_CONNECTED and self._lost:
            self._lost = False
            return True
        return False  # the first connect: the register queued before it goes out by itself

    def _drain(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(frame)

    def _handle(self, frame: bytes) -> None:
        try:
            msg = proto.decode(frame)
            handler = self._handlers.get(msg["type"])
            if handler is None:
                log.warning("dropped message of unknown type %r", msg["type"])
                return
            handler(msg)
        except ProtocolError as e:
            log.error("dropped message: %s", e)
        except Exception:  # a bug in one handler must not take the worker down
            log.exception("failed to handle a message")

    def _send(self, msg: dict[str, Any]) -> None:
        assert self._sock is not None
        try:
            # NOTE: never block: with the router gone for long, the queue fills (SNDHWM) and a
            # blocking send would hang the loop, deaf to `stop()` and to signals.
            self._sock.send(proto.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("router not reachable: dropped a %s message", msg["type"])

    # -- messages ---------------------------------------------------------------------------------
    def _register_msg(self) -> dict[str, Any]:
        pool = self.engine.scheduler.pages
        return proto.register(
            self.worker_id,
            self.device,
            self.model_name,
            list(self.tp_levels),
            pool.num_pages * pool.alloc.base_page_tokens,
            self.engine.max_context,
            sorted(self.engine.eos_token_ids),
        )

    def _heartbeat_msg(self) -> dict[str, Any]:
        sched = self.engine.scheduler
        running, waiting = len(sched.running), sched.num_waiting()
        return proto.heartbeat(self.worker_id, running, waiting, sched.pages.num_free, self.epoch)

    def _on_registered(self, msg: dict[str, Any]) -> None:
        epoch = msg.get("epoch", 0)
        self.epoch = epoch if isinstance(epoch, int) else self.epoch
        if not self.registered:
            log.info("worker %d registered (epoch %d)", self.worker_id, self.epoch)
        self.registered = True

    def _on_generate(self, msg: dict[str, Any]) -> None:
        rid = proto.request_id_of(msg)
        if rid in self.live:
            # Answering would end the running request's stream twice; the router owns ids.
            log.error("dropped generate for %r: that request is already running", rid)
            return
        ids = msg.get("input_ids")
        prompt_tokens = len(ids) if isinstance(ids, list) else 0
        self.live[rid] = prompt_tokens
        try:
            req = proto.parse_generate(msg)
            self.engine.add_request(rid, req.input_ids, req.sampling, req.klass, req.tier)
        except InvalidRequestError as e:
            self._final(rid, [], "error", str(e))
        except Exception as e:  # a bug must cost one request, not the worker
            log.exception("add_request(%r) failed", rid)
            self._final(rid, [], "error", f"internal error: {type(e).__name__}: {e}")

    def _on_abort(self, msg: dict[str, Any]) -> None:
        rid = proto.request_id_of(msg)
        if rid not in self.live:
            return  # unknown or already finished: races with completion are normal
        self._drop(rid)
        self._final(rid, [], "abort", None)

    def _on_reconfigure(self, msg: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        epoch = msg.get("epoch") if isinstance(msg.get("epoch"), int) else -1
        try:
            epoch, groups = proto.parse_reconfigure(msg)
            self.assignment = assignment_for(self.worker_id, groups)
            cap = self.assignment.max_batch or self.max_batch
            self.engine.scheduler.max_batch = min(self.max_batch, cap)
            self.epoch, error = epoch, None
        except (ProtocolError, PlanRefused) as e:
            error = str(e)
            log.warning("reconfigure to epoch %d refused: %s", epoch, error)
        ms = (time.perf_counter() - t0) * 1e3
        self._send(proto.reconfigured(self.worker_id, epoch, error is None, error, {"total": ms}))

    # -- engine -----------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            log.exception("engine step failed")
            # The sequences of the failed batch are the running ones; if none is running the
            # failure came before admission, so fail everyone rather than loop on it forever.
            running = [s.request_id for s in self.engine.scheduler.running]
            for rid in running or list(self.engine.seqs):
                self._fail(rid, f"engine step failed: {type(e).__name__}: {e}")
            return
        new: dict[str, list[int]] = {}
        reasons: dict[str, str] = {}
        for out in outputs:  # one message per request per step, whatever the engine yields
            new.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finish_reason is not None:
                reasons[out.request_id] = out.finish_reason
        for rid, ids in new.items():
            if rid not in self.live:
                log.error("engine produced tokens for unknown request %r", rid)
            elif rid in reasons:
                self._final(rid, ids, reasons[rid], None)
            else:
                self._send(proto.tokens(self.worker_id, rid, ids, self.live[rid]))

    def _drop(self, rid: str) -> None:
        """Take a request out of the engine (freeing its pages), even if the engine is upset."""
        try:
            self.engine.abort(rid)
        except Exception:
            log.exception("abort(%r) failed", rid)
            self.engine.seqs.pop(rid, None)

    def _fail(self, rid: str, error: str) -> None:
        """End one request with an error."""
        self._drop(rid)
        if rid in self.live:
            self._final(rid, [], "error", error)

    def _fail_all(self, error: str) -> None:
        for rid in list(self.live):
            self._fail(rid, error)

    def _final(self, rid: str, ids: list[int], reason: str, error: str | None) -> None:
        prompt_tokens = self.live.pop(rid)
        self._send(proto.tokens(self.worker_id, rid, ids, prompt_tokens, reason, error))
