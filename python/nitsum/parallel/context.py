"""A warm per-TP execution context: everything a rank needs to run one group level, in TP or
in SP (the same heads, hence the same KV layout)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nitsum.config import ModelConfig
from nitsum.parallel.collectives import Collectives
from nitsum.parallel.pipeline import Stage
from nitsum.parallel.shard import HeadRange, shard_views
from nitsum.parallel.ulysses import SPComm, build_sp_comm
from nitsum.weights.layout import LayerWeights, ModelWeights


@dataclass
class TPContext:
    """One TP level as seen by one rank, built once at start-up and reused on every switch.

    NOTE: activating a context only swaps a reference; its views, group and head ranges
    already exist, so a switch allocates, loads and creates nothing.
    """

    heads: HeadRange
    layers: list[LayerWeights]
    members: tuple[int, ...] = (0,)
    # The group's collectives (parallel/collectives.py); None for a single device.
    comm: Collectives | None = None
    # The same group run as sequence parallelism (parallel/ulysses.py); None at TP 1.
    sp: SPComm | None = None
    # This rank's pipeline stage in a (tp, pp) group (parallel/pipeline.py); None: one stage.
    stage: Stage | None = None
    stats: dict[str, int] = field(default_factory=lambda: {"all_reduce": 0})

    @property
    def tp(self) -> int:
        return self.heads.tp

    @property
    def rank(self) -> int:
        return self.heads.rank

    @property
    def leader(self) -> int:
        return self.members[0]

    @property
    def samples(self) -> bool:
        """Whether this rank returns the step's logits: TP rank 0 of the last stage."""
        return self.rank == 0 and (self.stage is None or self.stage.last)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum partial results of a row-parallel layer across the group (in place)."""
        if self.heads.tp > 1:
            assert self.comm is not None
            self.comm.all_reduce(x)
            self.stats["all_reduce"] += 1
        return x


def build_context(
    cfg: ModelConfig,
    weights: ModelWeights,
    tp: int,
    rank: int,
    members: tuple[int, ...] | None = None,
    comm: Collectives | None = None,
    stage: Stage | None = None,
) -> TPContext:
    """Build the warm context of (tp, rank); `members` are the group's device ids (stage-major
    for a pipeline, whose `stage` is this rank's and `comm` its stage's TP group's)."""
    heads = HeadRange.of(cfg, tp, rank)
    if tp > 1 and comm is None:
        raise ValueError("a TP>1 context needs its group's collectives")
    members = members if members is not None else tuple(range(tp))
    # NOTE: a pipeline's stages run TP only (SP shifts a whole group's tokens; not combined).
    sp = build_sp_comm(cfg, tp, rank, comm, weights.embed.device) if stage is None else None
    return TPContext(heads, shard_views(weights, tp, rank), members, comm, sp, stage)
