"""Prefill/decode disaggregation within one pool: a prefilled request moves to its decode group.

A request added with a `decode_group` (PoolEngine.add_request) prefills on its group; once its
prompt is in the cache and its first token sampled, its KV moves to the decode group with the
same pack / pipelined transfer / unpack path as a TP migration (kv_move.py), between steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nitsum.pool.kv_move import Move, commit_moves, transfer_moves

if TYPE_CHECKING:
    from nitsum.config import ModelConfig
    from nitsum.engine.engine import Engine
    from nitsum.engine.engine_config import EngineConfig
    from nitsum.parallel.topology import GroupShape
    from nitsum.pool.binding import Binder
    from nitsum.pool.devices import Devices


class HandoffPool(Protocol):
    """What a P/D hand-off needs of the PoolEngine."""

    pool: Devices
    cfg: ModelConfig
    ecfg: EngineConfig
    engines: dict[GroupShape, Engine]
    binder: Binder
    decode_targets: dict[str, GroupShape]
    counters: dict[str, int]


def hand_off_prefilled(pe: HandoffPool) -> None:
    """Move requests whose prefill finished on a prefill group to their decode group,
    with the same pack / pipelined transfer / unpack path as a TP migration."""
    moves: list[Move] = []
    paused = pe.binder.paused()
    for group, engine in pe.engines.items():
        if group in paused:
            continue  # NOTE: its devices are lent to a binding: nothing moves from there
        for seq in engine.running():
            target = pe.decode_targets.get(seq.request_id)
            if target is not None and target not in pe.engines:
                # NOTE: the decode group dissolved in a reconfiguration; the request
                # decodes where it is (a prefill group can decode, only less efficiently).
                del pe.decode_targets[seq.request_id]
                continue
            if target is None or target == group or target in paused:
                continue
            if seq.movable:
                moves.append((seq, target, engine))
    if not moves:
        return
    outcome = transfer_moves(pe.pool, pe.cfg, pe.ecfg.page_tokens, moves, pe.engines)
    commit_moves(moves, pe.engines, outcome)
    for seq, _, _ in moves:
        del pe.decode_targets[seq.request_id]
    pe.counters["kv_handoffs"] += len(moves)
    pe.counters["kv_handoff_bytes"] += outcome.bytes_moved
