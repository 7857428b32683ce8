"""Handing a bound request back to a replica at an iteration boundary (issue 32).

Two reasons, both with the KV move of a P/D handoff or a TP migration (pool/kv_move.py):

- bound for the prompt only (the cost model's `prefill`): once the prompt is done and the
  first token sampled, the KV goes to the replica the decision named, which decodes it; the
  binding is then released at this same boundary, so the replicas paused for the prompt's
  forward only;
- bound in full by the cost model: while it decodes and its replicas have work, it is asked
  again (`prompt_tokens: 0`) every `ASK_EVERY` iterations or when the replicas' number of
  requests changes; on `dp` the rest is cheaper on a replica (`bind_handbacks`).

NOTE: a failed transfer leaves every sequence with its old, intact KV (kv_move.py): the
request just goes on decoding bound.
"""

from __future__ import annotations

import logging
import time

from nitsum.pool.bind_choice import Chooser
from nitsum.pool.bound import Binding, Pool
from nitsum.pool.kv_move import Move, commit_moves, transfer_moves

log = logging.getLogger(__name__)

# Iterations between two questions "still worth binding?" while the replicas' load is the
# same (a question costs ~15 µs; the cost model's answer changes with that load).
ASK_EVERY = 4


def hand_back(pe: Pool, b: Binding, chooser: Chooser, counters: dict[str, int]) -> None:
    """Move `b`'s requests that should decode on a replica there (after a step of `b`)."""
    ask = _ask_now(pe, b) if b.weighed else False
    moves: list[Move] = []
    weighed_back: set[str] = set()
    for seq in b.engine.running():
        if not seq.movable:
            continue
        rid = seq.request_id
        target = b.prefill_only.get(rid)
        if target is None and ask and rid in b.weighed:
            block = {g: pe.engines[g] for g in b.replicas}
            choice = chooser.keep(b.shape.tp, block, seq)
            if choice.mode == "dp":
                target = choice.replica
                weighed_back.add(rid)
        if target is not None and target in pe.engines:
            moves.append((seq, target, b.engine))
    if not moves:
        return
    started = time.perf_counter()
    targets = {target: pe.engines[target] for _, target, _ in moves}
    try:
        outcome = transfer_moves(pe.pool, pe.cfg, pe.ecfg.page_tokens, moves, targets)
    except Exception as e:  # noqa: BLE001 - nothing committed: they decode bound
        log.warning("handing %d request(s) back to a replica failed: %s", len(moves), e)
        return
    commit_moves(moves, targets, outcome)
    ms = (time.perf_counter() - started) * 1e3
    chooser.note_handoff(sum(seq.num_computed for seq, _, _ in moves), ms)
    pe.counters["kv_migrated_bytes"] += outcome.bytes_moved
    for seq, _, _ in moves:
        rid = seq.request_id
        b.requests.discard(rid)
        b.prefill_only.pop(rid, None)
        b.weighed.discard(rid)
        counters["bind_handbacks"] += rid in weighed_back


def _ask_now(pe: Pool, b: Binding) -> bool:
    """Whether to ask about `b`'s weighed requests at this boundary: only while its replicas
    have work, every `ASK_EVERY` iterations or when their number of requests changed."""
    load = sum(len(pe.engines[g].request_ids()) for g in b.replicas if g in pe.engines)
    b.since_ask += 1
    if load == 0 or (b.since_ask < ASK_EVERY and load == b.asked_load):
        return False
    b.since_ask, b.asked_load = 0, load
    return True
