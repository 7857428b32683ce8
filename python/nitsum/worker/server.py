"""The worker server: one DEALER socket per served device id, around one backend.

A single-device worker is the N=1 case of a host worker (both a `PoolBackend`: a PoolEngine
over one in-process device or N device processes): towards the router both look like one
worker per device id (docs/protocol.md). One thread does everything: poll the sockets,
handle messages, run `backend.step()` while there is work, stream `tokens`, and send
`register` / `heartbeat` on each link's timers; only while a step runs does a second thread
(`heartbeat.py`) send the heartbeats, so that a long step is not silence. Messages are
handled between steps, so a `reconfigure` is always applied at an iteration boundary. See
docs/serving.md for how it is launched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import zmq

from nitsum.errors import InvalidRequestError
from nitsum.sampling_logprobs import TokenLogprob
from nitsum.worker import inbound
from nitsum.worker import protocol as proto
from nitsum.worker.assignment import Assignment, PlanRefused, local_plan
from nitsum.worker.backend import Backend
from nitsum.worker.heartbeat import StepHeartbeats
from nitsum.worker.link import RouterLink
from nitsum.worker.protocol import Message, ProtocolError
from nitsum.worker.stats import Stats

log = logging.getLogger(__name__)

Ack = tuple[bool, str | None, dict[str, float]]
KEPT_ACKS = 16  # answers of recent epochs, for the copies of a plan still on their way


class WorkerServer:
    """Serves `backend` to the router at `router_addr`, as one worker per device id.

    NOTE: every accepted `generate` ends in exactly one `tokens` message with a finish reason,
    sent on the socket the `generate` arrived on (also after a TP switch moved the request to
    another group): `self.live` holds the accepted ids, and `_final` is the only place that
    removes one.
    """

    def __init__(
        self,
        backend: Backend,
        router_addr: str,
        model_name: str,
        device: str = "cpu",
        register_every_s: float = 5.0,
        heartbeat_every_s: float = 0.5,
        idle_poll_ms: int = 50,
        context: zmq.Context | None = None,
        secret: bytes | None = None,
        kv_transport: str | None = None,
    ) -> None:
        """`secret`: the shared worker secret that answers the router's `challenge`
        (docs/security.md); without it only a router with authentication off accepts us.
        `kv_transport`: the KV transport's rendezvous address, when the backend joined one
        (sent in `register`: the router may then hand this process's KV to others)."""
        self.kv_transport = kv_transport
        self.backend = backend
        self.router_addr = router_addr
        self.model_name = model_name
        self.device = device
        self.register_every_s = register_every_s
        self.heartbeat_every_s = heartbeat_every_s
        self.idle_poll_ms = idle_poll_ms
        self.secret = secret
        self.ctx = context or zmq.Context.instance()
        self.epoch = 0
        # Each device's part of the plan at `epoch`.
        self.assignments: dict[int, Assignment] = {d: Assignment() for d in backend.device_ids}
        self.live: dict[str, tuple[int, int]] = {}  # request id -> (device it came on, prompt)
        self.links: dict[int, RouterLink] = {}
        self._acks: OrderedDict[int, Ack] = OrderedDict()  # epoch -> its answer
        # Device ids whose process died, until restarted: no register, no heartbeat.
        self.down: set[int] = set()
        self._stop = threading.Event()
        self.heartbeats = StepHeartbeats(self.links, heartbeat_every_s)

    @property
    def assignment(self) -> Assignment:
        """The first device's assignment (the whole story for a single-device worker)."""
        return self.assignments[self.backend.device_ids[0]]

    @property
    def registered(self) -> bool:
        """Whether the router has acknowledged every device's `register`."""
        return bool(self.links) and all(link.registered for link in self.links.values())

    def stop(self) -> None:
        """Ask the loop to exit (thread-safe); `run` returns within one poll interval."""
        self._stop.set()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until `shutdown` or `stop()`; closes the sockets on the way out."""
        poller = zmq.Poller()
        owners: dict[zmq.Socket, tuple[RouterLink, bool]] = {}  # socket -> (link, is monitor)
        for d in self.backend.device_ids:
            link = RouterLink(
                self.ctx,
                d,
                self.router_addr,
                self.register_every_s,
                self.heartbeat_every_s,
                authenticate=self.secret is not None,
            )
            self.links[d] = link
            for sock, is_monitor in ((link.sock, False), (link.monitor, True)):
                poller.register(sock, zmq.POLLIN)
                owners[sock] = (link, is_monitor)
        log.info("worker %s connecting to %s", self.backend.device_ids, self.router_addr)
        self.heartbeats = StepHeartbeats(self.links, self.heartbeat_every_s)
        self.heartbeats.start()
        next_stats = time.monotonic()
        try:
            while not self._stop.is_set():
                self._watch_devices()
                now = time.monotonic()
                for d, link in self.links.items():
                    if d in self.down:
                        # NOTE: the step thread must not keep a dead device alive either.
                        self.heartbeats.latest.pop(d, None)
                        continue
                    register, heartbeat = link.due(now)
                    if register:
                        link.send(self._opening_msg(link))
                    stale = d in self.heartbeats.stale  # the step thread resent an old load
                    self.heartbeats.stale.discard(d)
                    # NOTE: nothing but the handshake goes to a router that has not accepted us.
                    if (heartbeat or stale) and link.registered:
                        beat = self._heartbeat_msg(d)
                        self.heartbeats.latest[d] = beat
                        link.send(beat)
                    # One report per backend (on its first device's link): the counters cover
                    # all its devices. NOTE: on a timer of its own, not with the heartbeat:
                    # while steps run the heartbeat thread sends most heartbeats.
                    if d == self.backend.device_ids[0] and link.registered and now >= next_stats:
                        next_stats = now + self.heartbeat_every_s
                        counters, last_bind = self.backend.counters(), self.backend.last_bind()
                        if counters or last_bind is not None:
                            link.send(Stats.of(d, counters, last_bind))
                busy = self.backend.has_unfinished()
                events = poller.poll(0 if busy else self.idle_poll_ms)
                # Connection events first: a frame from a new peer is never taken for the old's.
                for sock, _ in sorted(events, key=lambda e: not owners[e[0]][1]):
                    link, is_monitor = owners[sock]
                    if is_monitor:
                        link.on_monitor()
                        continue
                    for frame in link.recv_all():
                        self._handle(link.worker_id, frame)
                if self.backend.has_unfinished() and not self._stop.is_set():
                    self._step()
                    self._watch_devices()  # NOTE: a device that died in the step: report now
            self._fail_all("worker shut down")
        finally:
            self.heartbeats.close()
            for link in self.links.values():
                link.close()
            self.links.clear()
            log.info("worker %s stopped", self.backend.device_ids)

    def _handle(self, device: int, frame: bytes) -> None:
        try:
            msg = proto.decode(frame)
            link = self.links[device]
            if not link.proven and msg["type"] not in ("challenge", "refused"):
                link.hold(frame)  # handled once the router proves the secret, else dropped
                return
            if msg["type"] == "generate":
                self._on_generate(device, msg)
                return
            if msg["type"] == "reconfigure":  # answered even when it does not parse
                self._on_reconfigure(device, msg)
                return
            kind = proto.ROUTER_MESSAGES.get(msg["type"])
            if kind is None:
                log.warning("dropped message of unknown type %r", msg["type"])
                return
            self._dispatch(device, kind.from_wire(msg))
        except ProtocolError as e:
            log.error("dropped message: %s", e)
        except Exception:  # a bug in one handler must not take the worker down
            log.exception("failed to handle a message")

    def _dispatch(self, device: int, msg: Message) -> None:
        match msg:
            case proto.Challenge():
                self._on_challenge(device, msg)
            case proto.Refused():
                log.error("router refused worker %d: %s", device, msg.error)
            case proto.Registered():
                self._on_registered(device, msg)
            case proto.Reregister():
                self._on_reregister(device)
            case proto.Abort():
                self._on_abort(msg.request_id)
            case proto.FlushCache():
                freed = self.backend.flush_prefix_cache()
                log.info("flushed the prefix caches: %d device pages freed", freed)
            case proto.Shutdown():
                self._stop.set()

    # -- messages ---------------------------------------------------------------------------------
    def _opening_msg(self, link: RouterLink) -> Message:
        """What opens a registration: `hello` when we have a secret (the router must prove it
        first, docs/protocol.md "Handshake"), else a plain `register`."""
        return self._register_msg(link.worker_id) if self.secret is None else link.hello()

    def _register_msg(self, device: int, auth: str | None = None) -> proto.Register:
        kv_tokens, max_context, eos = self.backend.capacity()
        tp_levels, domain = self.backend.register_shape(device)
        return proto.Register(
            device,
            self.device,
            self.model_name,
            tp_levels,
            domain,
            kv_tokens,
            max_context,
            list(eos),
            auth=auth,
            kv_transport=self.kv_transport,
        )

    def _heartbeat_msg(self, device: int) -> proto.Heartbeat:
        running, waiting, free_pages = self.backend.load(device)
        return proto.Heartbeat(device, running, waiting, free_pages, self.epoch)

    def _on_challenge(self, device: int, msg: proto.Challenge) -> None:
        """Check the router's proof of the secret; only then prove ours in `register` and
        handle what it sent meanwhile (docs/protocol.md "Handshake")."""
        if self.secret is None:
            log.error(
                "the router requires worker authentication: set %s for worker %d",
                proto.SECRET_ENV,
                device,
            )
            return
        link = self.links[device]
        auth = link.answer(self.secret, msg, self.model_name)
        if auth is None:
            log.error(
                "the peer at %s did not prove the worker secret to worker %d (a wrong secret, "
                "an old router, or not the router at all): sent it nothing; retrying in %.0f s",
                self.router_addr,
                device,
                self.register_every_s,
            )
            return
        link.send(self._register_msg(device, auth))
        for frame in link.take_held():
            self._handle(device, frame)

    def _on_registered(self, device: int, msg: proto.Registered) -> None:
        self.epoch = msg.epoch
        if not self.links[device].registered:
            log.info("worker %d registered (epoch %d)", device, self.epoch)
            # Maybe a restarted router, whose epochs may repeat the old one's: forget the
            # answers kept for the old router's plans.
            self._acks.clear()
            self._drop_orphans(device)
        self.links[device].registered = True

    def _drop_orphans(self, device: int) -> None:
        """Abort what arrived on `device` before this registration, without answering.

        NOTE: a router that admits a worker (again) holds none of its earlier requests (a
        restarted router never knew them; a live one resumes them elsewhere, state/workers.rs):
        running them on would only hold KV pages nobody reads."""
        orphans = [rid for rid, (arrived_on, _) in self.live.items() if arrived_on == device]
        for rid in orphans:
            self.backend.abort(rid)
            del self.live[rid]
        if orphans:
            log.warning("worker %d aborted %d requests of a lost router", device, len(orphans))

    def _on_reregister(self, device: int) -> None:
        """The router declared this device dead (e.g. a step outlasted the heartbeat timeout)
        and already ended its requests: drop them here too and register again at once."""
        for rid, (arrived_on, _) in list(self.live.items()):
            if arrived_on == device:
                self.backend.abort(rid)
                del self.live[rid]
        log.warning("router asked worker %d to register again", device)
        link = self.links[device]
        link.registered = False
        link.next_register = time.monotonic()

    def _watch_devices(self) -> None:
        """Report dead devices to the router at once (`device_lost`: it resumes their
        requests elsewhere) and register restarted ones again (worker/device_watch.py)."""
        events = self.backend.device_events()
        for lost in events.lost:
            d = lost.device
            self.down.add(d)
            mates: set[int] = set()
            for rid in lost.request_ids:  # dropped by the engines: no final from here
                arrived_on, _ = self.live.pop(rid, (d, 0))
                mates.add(arrived_on)
            # NOTE: the router resumes every request that came on `d`, wherever it runs now.
            for rid in [r for r, (on, _) in self.live.items() if on == d]:
                self.backend.abort(rid)
                del self.live[rid]
            link = self.links[d]
            link.registered = False
            link.send(proto.DeviceLost(d, lost.reason))  # NOTE: after its last `tokens`
            # Members of a TP group with `d` that live on: their requests were dropped too;
            # registering again is how the router learns to resume them (`reregister`).
            for mate in sorted(mates - self.down):
                self._on_reregister(mate)
        for d in events.back:
            self.down.discard(d)
            self.links[d].next_register = time.monotonic()

    def _on_generate(self, device: int, msg: dict[str, Any]) -> None:
        rid = inbound.request_id_of(msg)
        if device in self.down:
            # Sent before the router read our `device_lost`: it resumes this request too.
            log.warning("dropped generate for %r on lost device %d", rid, device)
            return
        if rid in self.live:
            # Answering would end the running request's stream twice; the router owns ids.
            log.error("dropped generate for %r: that request is already running", rid)
            return
        ids = msg.get("input_ids")
        self.live[rid] = (device, len(ids) if isinstance(ids, list) else 0)
        try:
            self.backend.add(device, inbound.parse_generate(msg))
        except InvalidRequestError as e:
            self._final(rid, [], "error", str(e), error_param=e.field)
        except Exception as e:  # a bug must cost one request, not the worker
            log.exception("add(%r) failed", rid)
            self._final(rid, [], "error", f"internal error: {type(e).__name__}: {e}")

    def _on_abort(self, rid: str) -> None:
        if rid not in self.live:
            return  # unknown or already finished: races with completion are normal
        self.backend.abort(rid)
        self._final(rid, [], "abort", None)

    def _on_reconfigure(self, device: int, msg: dict[str, Any]) -> None:
        """Apply a plan once per epoch; every copy (one per member device) gets one answer.

        NOTE: the first copy to arrive applies the plan; copies of the same epoch on the other
        devices' sockets are answered from `_acks` without touching the engines again.
        """
        t0 = time.perf_counter()
        epoch = msg["epoch"] if isinstance(msg.get("epoch"), int) else -1
        ack = self._acks.get(epoch)
        if ack is None:
            ack = self._apply(msg, t0)
        ok, error, timings = ack
        self.links[device].send(proto.Reconfigured(device, epoch, ok, error, timings))

    def _apply(self, msg: dict[str, Any], t0: float) -> Ack:
        try:
            plan_msg = proto.Reconfigure.from_wire(msg)
        except ProtocolError as e:
            log.warning("reconfigure refused: %s", e)
            return False, str(e), {"total": (time.perf_counter() - t0) * 1e3}
        epoch, groups = plan_msg.epoch, plan_msg.groups
        try:
            if epoch < self.epoch:
                raise PlanRefused(f"epoch {epoch} is older than the active epoch {self.epoch}")
            plan = local_plan(self.backend.device_ids, groups)
            timings = self.backend.reconfigure(plan)
            self.epoch, self.assignments = epoch, plan.assignments
            ack: Ack = (True, None, timings)
        except PlanRefused as e:
            log.warning("reconfigure to epoch %d refused: %s", epoch, e)
            ack = (False, str(e), {})
        except Exception as e:  # e.g. a device process failed: answer anyway, never hang
            log.exception("reconfigure to epoch %d failed", epoch)
            ack = (False, f"internal error: {type(e).__name__}: {e}", {})
        ack[2]["total"] = (time.perf_counter() - t0) * 1e3
        self._acks[epoch] = ack
        while len(self._acks) > KEPT_ACKS:
            self._acks.popitem(last=False)
        return ack

    # -- engine -----------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            with self.heartbeats.stepping():
                outputs = self.backend.step()
        except Exception as e:
            log.exception("engine step failed")
            # The sequences of the failed batch are the running ones; if none is running the
            # failure came before admission, so fail everyone rather than loop on it forever.
            for rid in self.backend.running() or self.backend.requests():
                self._fail(rid, f"engine step failed: {type(e).__name__}: {e}")
            return
        left, came = self.backend.moved()
        for rid in left:  # handed to another process, which ends it: no final from here
            self.live.pop(rid, None)
        for rid, device, prompt_tokens in came:  # streams on the decode target's socket
            self.live[rid] = (device, prompt_tokens)
        new: dict[str, list[int]] = {}
        reasons: dict[str, str] = {}
        errors: dict[str, str] = {}
        queued: dict[str, float] = {}
        logprobs: dict[str, list[TokenLogprob]] = {}
        prompt_lps: dict[str, list[TokenLogprob]] = {}
        cached: dict[str, int] = {}
        for out in outputs:  # one message per request per step, whatever the engine yields
            new.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.queue_s is not None:
                queued[out.request_id] = out.queue_s * 1e3
            if out.logprobs is not None:
                logprobs.setdefault(out.request_id, []).extend(out.logprobs)
            if out.prompt_logprobs is not None:
                prompt_lps[out.request_id] = out.prompt_logprobs
            if out.cached_tokens is not None:
                cached[out.request_id] = out.cached_tokens
            if out.finish_reason is not None:
                reasons[out.request_id] = out.finish_reason
            if out.error is not None:
                errors[out.request_id] = out.error
        for rid, ids in new.items():
            if rid not in self.live:
                log.error("engine produced tokens for unknown request %r", rid)
            elif rid in reasons:
                failed = errors.get(rid, "the engine failed this request (see the worker log)")
                error = failed if reasons[rid] == "error" else None
                self._final(
                    rid,
                    ids,
                    reasons[rid],
                    error,
                    queued.get(rid),
                    logprobs.get(rid),
                    prompt_logprobs=prompt_lps.get(rid),
                    cached_tokens=cached.get(rid),
                )
            else:
                device, prompt_tokens = self.live[rid]
                msg = proto.Tokens(
                    device,
                    rid,
                    ids,
                    None,
                    None,
                    prompt_tokens,
                    queue_ms=queued.get(rid),
                    logprobs=logprobs.get(rid),
                    prompt_logprobs=prompt_lps.get(rid),
                    cached_tokens=cached.get(rid),
                )
                self.links[device].send(msg)

    def _fail(self, rid: str, error: str) -> None:
        """End one request with an error."""
        self.backend.abort(rid)
        if rid in self.live:
            self._final(rid, [], "error", error)

    def _fail_all(self, error: str) -> None:
        for rid in list(self.live):
            self._fail(rid, error)

    def _final(
        self,
        rid: str,
        ids: list[int],
        reason: str,
        error: str | None,
        queue_ms: float | None = None,
        logprobs: list[TokenLogprob] | None = None,
        error_param: str | None = None,
        prompt_logprobs: list[TokenLogprob] | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        device, prompt_tokens = self.live.pop(rid)
        msg = proto.Tokens(
            device,
            rid,
            ids,
            reason,  # type: ignore[arg-type]
            error,
            prompt_tokens,
            queue_ms=queue_ms,
            logprobs=logprobs,
            error_param=error_param,
            prompt_logprobs=prompt_logprobs,
            cached_tokens=cached_tokens,
        )
        self.links[device].send(msg)
