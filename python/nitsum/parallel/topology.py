"""The TP topology of a pool: which levels it can run and the groups they form.

One object owns what used to be derived in several places: the levels a model allows
(`ModelConfig.allowed_tp_levels`) that fit in the pool, the aligned groups of each level
(the communicator pool creates exactly these), a device's group at a level, and whether a
plan's groups are valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from nitsum.config import DEFAULT_TP_LEVELS, ModelConfig


@dataclass(frozen=True, order=True)
class GroupShape:
    """The devices one engine runs on: `pp` pipeline stages of `tp` devices each, `members`
    stage-major (stage s is `members[s*tp : (s+1)*tp]`). `pp == 1` is a TP group.

    NOTE: this is also a sequence's KV layout: rank r of a stage holds the KV heads
    `parallel.shard.kv_head_range(H, tp, r)` of its stage's layers, in the same page ids on
    every member. Frozen and hashable, so it keys a pool's engines, bindings, pipelines and
    warm contexts; ordered by (members, tp, pp), so groups sort by their devices as before.
    The TP degree is always `tp`, never `len(members)` (a pipeline has tp·pp members).
    """

    members: tuple[int, ...] = (0,)
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1 or len(self.members) != self.tp * self.pp:
            raise ValueError(
                f"group {self.members}: {len(self.members)} devices are not {self.pp} "
                f"stage(s) of TP {self.tp}"
            )

    @classmethod
    def tp_group(cls, members: tuple[int, ...]) -> GroupShape:
        """One TP group of all of `members`."""
        return cls(tuple(members), len(members), 1)

    @classmethod
    def pipeline(cls, members: tuple[int, ...], stage_tp: int) -> GroupShape:
        """Stages of `stage_tp` devices over `members` (one stage when that is all of them)."""
        if stage_tp < 1 or len(members) % stage_tp:
            raise ValueError(f"group {members}: not whole stages of TP {stage_tp}")
        return cls(tuple(members), stage_tp, len(members) // stage_tp)

    @property
    def is_pipeline(self) -> bool:
        return self.pp > 1

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def leader(self) -> int:
        """The first member: a group's requests are counted on it."""
        return self.members[0]

    def holds(self, device: int) -> bool:
        """Whether `device` is one of the members."""
        return device in self.members

    def overlaps(self, other: GroupShape) -> bool:
        """Whether the two groups share a device."""
        return not set(self.members).isdisjoint(other.members)

    def within(self, other: GroupShape) -> bool:
        """Whether every member of this group is one of `other`'s."""
        return set(self.members) <= set(other.members)

    def stage(self, s: int) -> tuple[int, ...]:
        """The members of stage `s`."""
        return self.members[s * self.tp : (s + 1) * self.tp]

    def __str__(self) -> str:
        return f"{list(self.members)} (TP {self.tp} x PP {self.pp})"


@dataclass(frozen=True)
class TPTopology:
    """`levels`: the TP levels the pool can run, ascending, 1 always among them.

    NOTE: groups are aligned contiguous blocks [k·p, …, k·p+p-1] (O(N) groups, Flying Serving
    §4.3): a plan's groups, the warm contexts and the communicators all come from here.
    """

    num_devices: int
    levels: tuple[int, ...]

    @classmethod
    def of(
        cls, cfg: ModelConfig, num_devices: int, candidates: tuple[int, ...] = DEFAULT_TP_LEVELS
    ) -> TPTopology:
        """The levels among `candidates` the model allows and `num_devices` can hold."""
        levels = tuple(p for p in cfg.allowed_tp_levels(candidates) if p <= num_devices)
        return cls(num_devices, levels)

    def group_of(self, device: int, tp: int) -> GroupShape:
        """The aligned TP group of level `tp` that holds `device`."""
        start = device - device % tp
        return GroupShape.tp_group(tuple(range(start, start + tp)))

    def aligned_groups(self, min_tp: int = 2) -> list[GroupShape]:
        """Every aligned TP group of each level ≥ `min_tp` that fits in the pool."""
        return [
            GroupShape.tp_group(tuple(range(start, start + p)))
            for p in self.levels
            if p >= min_tp
            for start in range(0, self.num_devices - p + 1, p)
        ]

    def pipelines(self, num_layers: int, pp_levels: tuple[int, ...]) -> list[GroupShape]:
        """Every pipeline: `pp` ≥ 2 stages of an allowed TP level, on an aligned block of
        tp·pp devices (stage-major; each stage an aligned TP group), for each depth of
        `pp_levels` that the pool and the model's layers allow."""
        out = []
        for pp in sorted(set(pp_levels)):
            for tp in self.levels:
                n = tp * pp
                if pp < 2 or pp > num_layers or n > self.num_devices:
                    continue
                out += [
                    GroupShape(tuple(range(k, k + n)), tp, pp)
                    for k in range(0, self.num_devices - n + 1, n)
                ]
        return out

    def check(self, groups: list[GroupShape]) -> None:
        """Raise ValueError unless `groups` are disjoint aligned TP groups of allowed levels."""
        seen: set[int] = set()
        for g in groups:
            members = list(g.members)
            if g.is_pipeline:
                raise ValueError(f"group {members}: a pipeline, not a TP group")
            if g.tp not in self.levels:
                raise ValueError(
                    f"group {members}: TP {g.tp} not in the allowed levels {self.levels}"
                )
            if g != self.group_of(g.leader, g.tp) or g.members[-1] >= self.num_devices:
                raise ValueError(
                    f"group {members} is not an aligned block of the {self.num_devices}-device pool"
                )
            if seen & set(g.members):
                raise ValueError(f"group {members} overlaps another group")
            seen |= set(g.members)
