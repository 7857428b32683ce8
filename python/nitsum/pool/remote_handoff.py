"""Prefill/decode disaggregation across host worker processes.

A request whose decode target is served by another process prefills here; once its prompt is
done and its first token sampled, its KV (kv_wire.py), tokens and sampler state go to that
process over the KV transport (peers.py), which adopts the sequence and streams every token,
the first one included, on the decode target's socket. NOTE: the first token is held back
here and sent with the KV, so the client sees the stream from one process, in order.

Nothing is lost on either side: the sequence leaves this process only once its handoff was
sent in full (a failed send decodes it here, as a prefill group can); an arrival whose KV does
not fit is recomputed from its tokens by the receiver. A process that dies mid-transfer is the
router's to handle (it re-runs the request from the tokens streamed, docs/protocol.md).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from nitsum.engine.engine import Engine
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.request_wire import spec_from_wire, spec_to_wire
from nitsum.engine.sequence import Sequence, Status
from nitsum.errors import InvalidRequestError
from nitsum.kv.pages import OutOfPages
from nitsum.pool.kv_wire import export_kv, import_kv
from nitsum.pool.migration_plan import Placement
from nitsum.pool.peers import KVPeers, PeerError
from nitsum.pool.pool_engine import PoolEngine
from nitsum.structured.start import start_grammar

log = logging.getLogger(__name__)


class RemoteHandoffs:
    """The requests of a PoolEngine that decode in another process, and those that came from
    one. `moved()` tells the server which ids left (no final message here) and which arrived
    (and on which worker id they stream)."""

    def __init__(self, pe: PoolEngine, peers: KVPeers) -> None:
        self.pe = pe
        self.peers = peers
        self.targets: dict[str, int] = {}  # request id -> decode target (a remote worker id)
        self._left: list[str] = []
        self._came: list[tuple[str, int, int]] = []  # (request id, worker id, prompt tokens)
        self.counters = dict.fromkeys(
            (
                "kv_remote_out",
                "kv_remote_in",
                "kv_remote_bytes",
                "kv_remote_failed",
                "kv_remote_recomputed",
            ),
            0,
        )

    def wants(self, decode_target: int | None) -> bool:
        """Whether `decode_target` is a worker of another process of the transport."""
        return decode_target is not None and self.peers.serves(decode_target)

    def add(self, request_id: str, decode_target: int) -> None:
        self.targets[request_id] = decode_target

    def drop(self, request_id: str) -> None:
        self.targets.pop(request_id, None)

    def pending(self) -> bool:
        return self.peers.pending()

    def moved(self) -> tuple[list[str], list[tuple[str, int, int]]]:
        """(ids handed off, (id, worker id, prompt tokens) adopted) since the last call."""
        left, came = self._left, self._came
        self._left, self._came = [], []
        return left, came

    # -- sending ----------------------------------------------------------------------------
    def ship(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Hand off the requests whose prefill just finished; returns `outputs` without the
        first tokens of those that left."""
        for out in outputs:
            if out.finished:
                self.targets.pop(out.request_id, None)
        # NOTE: only a first token sampled in this very step is still unsent (held back
        # below); a request that got past it here (its group was lent to a binding at the
        # time) decodes here, or the receiver would stream that token twice.
        fresh = {o.request_id for o in outputs if o.new_token_ids}
        paused = self.pe.binder.paused()
        left: set[str] = set()
        for group, engine in list(self.pe.engines.items()):
            if group in paused:
                continue
            for seq in engine.running():
                target = self.targets.get(seq.request_id)
                if target is None or not seq.movable:
                    continue
                del self.targets[seq.request_id]  # NOTE: one try; a failure decodes here
                first = len(seq.output_ids) == 1 and seq.request_id in fresh
                if first and self._send(seq, engine, target):
                    left.add(seq.request_id)
        return [o for o in outputs if o.request_id not in left]

    def _send(self, seq: Sequence, engine: Engine, target: int) -> bool:
        placement = Placement(seq.layout, tuple(seq.pages))
        kv = export_kv(
            self.pe.pool, self.pe.cfg, self.pe.ecfg.page_tokens, seq.num_computed, placement
        )
        log.info(
            "sending KV of %s (%d tokens) to worker %d", seq.request_id, seq.num_computed, target
        )
        try:
            sent = self.peers.send(target, _meta(seq, target), kv)
        except PeerError as e:
            log.warning("%s; %s decodes here", e, seq.request_id)
            self.counters["kv_remote_failed"] += 1
            return False
        engine.detach(seq)
        self._left.append(seq.request_id)
        self.counters["kv_remote_out"] += 1
        self.counters["kv_remote_bytes"] += sent
        return True

    # -- receiving --------------------------------------------------------------------------
    def receive(self, group_of: dict[int, tuple[int, ...]]) -> list[RequestOutput]:
        """Adopt the handoffs that arrived, each on the group holding its decode target
        (`group_of`: worker id -> group); returns their first tokens to stream."""
        outputs = []
        for meta, kv in self.peers.arrivals():
            if any(meta["request_id"] in e.request_ids() for _, e in self.pe.every_engine()):
                log.error("dropped a handoff of %s: it already runs here", meta["request_id"])
                continue
            target = int(meta["target"])
            group = group_of[target]
            try:
                seq = self._adopt(meta, kv, group)
            except (InvalidRequestError, ValueError) as e:
                # NOTE: its sender let it go: end it with the error rather than lose it.
                log.error("handoff of %s refused: %s", meta["request_id"], e)
                outputs.append(RequestOutput(meta["request_id"], [], "error", str(e)))
                continue
            self._came.append((seq.request_id, target, len(seq.prompt_ids)))
            self.counters["kv_remote_in"] += 1
            outputs.append(RequestOutput(seq.request_id, list(seq.output_ids), None))
        return outputs

    def _adopt(self, meta: dict[str, Any], kv: torch.Tensor, group: tuple[int, ...]) -> Sequence:
        engine = self.pe.engines[group]
        seq = _sequence(meta)
        pages = engine.pages
        need = pages.pages_for(seq.num_computed)
        engine.reclaim(need)  # NOTE: idle cached pages give way to arriving KV
        try:
            seq.pages = pages.allocate(need)
            placement = Placement(engine.shape, tuple(seq.pages))
            import_kv(self.pe.pool, self.pe.cfg, self.pe.ecfg.page_tokens, kv, placement)
        except (OutOfPages, RuntimeError) as e:  # no room, or a device failed: recompute
            log.warning("handoff of %s recomputes: %s", seq.request_id, e)
            if seq.pages:
                pages.release(seq.pages)
            seq.pages, seq.num_computed, seq.status = [], 0, Status.WAITING
            self.counters["kv_remote_recomputed"] += 1
        seq.layout = engine.shape
        engine.adopt(seq)
        return seq


def _meta(seq: Sequence, target: int) -> dict[str, Any]:
    """What the receiver needs besides the KV to go on exactly where this process stopped:
    the whole spec in its `generate` form (engine/request_wire.py; NOTE: the grammar as its
    wire form, the receiver replays the output into a fresh matcher) and the sequence's state."""
    generator = seq.generator.get_state().numpy().tobytes() if seq.generator is not None else None
    return {
        "target": target,
        "request_id": seq.request_id,
        "prompt_ids": seq.prompt_ids,
        "output_ids": seq.output_ids,
        "num_computed": seq.num_computed,
        # NOTE: the class as it is now (the scheduler may have demoted it).
        "spec": spec_to_wire(seq.spec) | {"class": seq.klass},
        "generator": generator,
    }


def _sequence(meta: dict[str, Any]) -> Sequence:
    """The running sequence a handoff describes (pages still to be given)."""
    spec = spec_from_wire(meta["spec"])
    seq = Sequence(meta["request_id"], list(meta["prompt_ids"]), spec)
    seq.output_ids = list(meta["output_ids"])
    # The grammar where the sender's was: started on the prompt, then over the output so far.
    seq.grammar = start_grammar(spec.sampling.grammar, seq.prompt_ids)
    if seq.grammar is not None and seq.output_ids and not seq.grammar.consume(seq.output_ids):
        raise ValueError(f"handoff of {seq.request_id}: its output breaks its grammar")
    seq.num_computed = int(meta["num_computed"])
    seq.status = Status.RUNNING
    if meta["generator"] is not None:
        seq.generator = torch.Generator()
        seq.generator.set_state(torch.frombuffer(bytearray(meta["generator"]), dtype=torch.uint8))
    return seq
