"""The `stats` message (worker → router): a host worker's cumulative counters and KV gauges.

The router exports each field as `nitsum_worker_stat{worker, name}` and reads some into the
`vllm:*` metrics (scheduler-rs `protocols/worker/` `Stats`, docs/protocol.md). A field is
absent when this worker does not have the part that counts it (no host KV tier, no KV peers).
Besides the numbers, `last_bind` carries the pool's latest binding decision (bind_decision.py),
which the router shows in `/admin/plan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from nitsum.codec import Message, wire_field
from nitsum.worker.bind_decision import BindDecision


def _stat() -> Any:
    """An optional stat: absent from the wire when None."""
    return wire_field(omit=None, default=None)


@dataclass(frozen=True)
class Stats(Message):
    """Counters since the worker started (dissolved groups' included) and current gauges.

    NOTE: the field names are the wire keys and the router's `Stats` fields; a counter the
    router does not know is dropped there, so adding one means adding it on both sides (the
    golden fixture tests/golden/wire/stats.msgpack fails until both agree).
    """

    TYPE = "stats"
    worker_id: int
    # The pool (pool/pool_engine.py): P/D handoffs, plan switches, steps by parallelism.
    kv_handoffs: int | None = _stat()
    kv_handoff_bytes: int | None = _stat()
    reconfigurations: int | None = _stat()
    kv_migrated_bytes: int | None = _stat()
    sp_steps: int | None = _stat()
    tp_steps: int | None = _stat()
    pp_steps: int | None = _stat()
    # Per-request TP bindings (pool/binding.py).
    tp_binds: int | None = _stat()
    tp_binds_soft: int | None = _stat()
    tp_bound_requests: int | None = _stat()
    tp_binds_clamped: int | None = _stat()
    # The binding cost model (scheduler-rs binding/): decisions taken by chosen mode, full
    # bindings handed back to a replica mid-decode, iterations soft bindings gave to replicas.
    bind_decisions_dp: int | None = _stat()
    bind_decisions_prefill: int | None = _stat()
    bind_decisions_full: int | None = _stat()
    bind_handbacks: int | None = _stat()
    bind_soft_yields: int | None = _stat()
    # The engines (engine/engine.py `counters`): prefix cache, preemption, host KV tier.
    prefix_cache_queries: int | None = _stat()
    prefix_cache_hits: int | None = _stat()
    prefix_cache_host_hits: int | None = _stat()
    num_preemptions: int | None = _stat()
    num_preemptions_swap: int | None = _stat()
    swap_out_pages: int | None = _stat()
    swap_in_pages: int | None = _stat()
    swap_bytes: int | None = _stat()
    swap_copies: int | None = _stat()
    swap_waits: int | None = _stat()
    # Gauges: percent of device / host KV pages in use (idle cached pages count as free).
    kv_cache_usage_perc: int | float | None = _stat()
    host_kv_usage_perc: int | float | None = _stat()
    # KV handed to / from other host worker processes (pool/remote_handoff.py).
    kv_remote_out: int | None = _stat()
    kv_remote_in: int | None = _stat()
    kv_remote_bytes: int | None = _stat()
    kv_remote_failed: int | None = _stat()
    kv_remote_recomputed: int | None = _stat()
    # The pool's most recent binding decision (None: it took none).
    last_bind: BindDecision | None = _stat()

    @classmethod
    def of(
        cls,
        worker_id: int,
        counters: Mapping[str, int | float],
        last_bind: BindDecision | None = None,
    ) -> Stats:
        """The message for a backend's `counters()` and last binding decision; ValueError on
        a counter it has no field for (one added without adding it here, and to the router)."""
        unknown = set(counters) - {f.name for f in fields(cls)} - {"worker_id", "last_bind"}
        if unknown:
            raise ValueError(f"stats: no field for counters {sorted(unknown)}")
        return cls(worker_id, **counters, last_bind=last_bind)  # type: ignore[arg-type]
