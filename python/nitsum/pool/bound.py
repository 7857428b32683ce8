"""What a binding is (pool/binding.py): the bound group's state, and what a binder needs of
its PoolEngine."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from nitsum.config import ModelConfig
from nitsum.engine.engine import Engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.kv.pages import PageAllocator
from nitsum.parallel.topology import GroupShape, TPTopology
from nitsum.pool.devices import Devices


class Pool(Protocol):
    """What a binder needs of its PoolEngine (pool/pool_engine.py)."""

    pool: Devices
    cfg: ModelConfig
    ecfg: EngineConfig
    topology: TPTopology
    allowed: tuple[int, ...]
    alloc: PageAllocator
    engines: dict[GroupShape, Engine]
    counters: dict[str, int]
    retired: Counter[str]

    def new_engine(self, shape: GroupShape) -> Engine: ...


@dataclass
class Binding:
    """A TP group (`shape`) over the plan's `replicas`, with its own scheduler (`engine`) over
    the same pages; `requests` are the ones it serves."""

    shape: GroupShape
    replicas: list[GroupShape]
    engine: Engine
    hard: bool
    formed: bool = False
    requests: set[str] = field(default_factory=set)
    # Counted in `tp_binds` (once its first request was accepted).
    counted: bool = False
    # Soft: alternates iterations with its replicas (False: they pause while it runs).
    interleave: bool = False
    # Whether the bound group runs this iteration (else its replicas do).
    bound_turn: bool = True
    # Bound for the prompt only: request → the replica that decodes it (bind_handback.py).
    prefill_only: dict[str, GroupShape] = field(default_factory=dict)
    # Bound in full by the cost model: asked again while they decode (bind_handback.py).
    weighed: set[str] = field(default_factory=set)
    # Iterations since those were last asked, and the replicas' request count then.
    since_ask: int = 0
    asked_load: int = -1
