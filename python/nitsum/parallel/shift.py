"""The shift rule: a group runs an iteration as SP when it batches many tokens, as TP otherwise.

TP splits every weight read across the group and all-reduces twice per layer on every token;
SP reads the full weights on each rank but moves a fraction of the activations (two
all-to-alls per layer). So TP is faster for few tokens (decode, memory-bound) and SP for many
(prefill-heavy, compute-bound): Shift Parallelism §3.3 picks per iteration by comparing the
batched tokens with a threshold, the crossover of the two modes' measured latencies.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

# Batched tokens above which a group runs SP when no measured profile says otherwise (a
# profile's fitted crossover replaces it: `nitsum profile`, docs/profile-schema.md). A guess
# shaped for GPUs, where decode is memory-bound and TP reads 1/p of the weights: decode
# batches up to 256 stay TP, prefill-heavy iterations go SP. NOTE: on CPU devices the
# measured crossover is 0 (gloo's all-reduce costs more than its all-to-all even for one
# token: scripts/bench_shift.py), so there a profile makes every iteration SP.
DEFAULT_SHIFT_THRESHOLD = 256


@dataclass(frozen=True)
class ShiftRule:
    """`threshold`: batched tokens above which a group of ≥ 2 devices runs SP (None: always
    TP); `by_size` overrides it per group size (a profile's measured crossovers)."""

    threshold: int | None = DEFAULT_SHIFT_THRESHOLD
    by_size: Mapping[int, int | None] = field(default_factory=dict)

    def sequence_parallel(self, group_size: int, tokens: int) -> bool:
        """Whether a group of `group_size` devices runs an iteration of `tokens` tokens as SP."""
        if group_size < 2:
            return False
        threshold = self.by_size.get(group_size, self.threshold)
        return threshold is not None and tokens > threshold

    @classmethod
    def parse(cls, spec: str) -> ShiftRule:
        """A rule from the command-line form: comma-separated items, each `N` (the default
        threshold), `off` (TP only) or `SIZE=N` / `SIZE=off` (one group size), e.g.
        `256,4=64`. ValueError on anything else."""
        threshold: int | None = DEFAULT_SHIFT_THRESHOLD
        by_size: dict[int, int | None] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            size, eq, value = item.rpartition("=")
            try:
                tokens = None if value == "off" else int(value)
                group_size = int(size) if eq else 0
            except ValueError:
                raise ValueError(
                    f"shift threshold {item!r}: expected N, off, SIZE=N or SIZE=off"
                ) from None
            if tokens is not None and tokens < 0:
                raise ValueError(f"shift threshold {item!r}: tokens must be >= 0")
            if not eq:
                threshold = tokens
            elif group_size < 2:
                raise ValueError(f"shift threshold {item!r}: group sizes start at 2")
            else:
                by_size[group_size] = tokens
        return cls(threshold, by_size)

    def spec(self) -> str:
        """The command-line form `parse` reads back."""
        items = ["off" if self.threshold is None else str(self.threshold)]
        for size, tokens in sorted(self.by_size.items()):
            items.append(f"{size}={'off' if tokens is None else tokens}")
        return ",".join(items)

    @classmethod
    def from_profile(cls, profile: Mapping[str, object]) -> ShiftRule | None:
        """The rule a measured profile's `shift_threshold` gives (None when it has none).
        ValueError on a malformed one (sizes ≥ 2, thresholds integers ≥ 0 or null)."""
        measured = profile.get("shift_threshold")
        if measured is None or measured == {}:
            return None
        if not isinstance(measured, Mapping):
            raise ValueError("shift_threshold must map group sizes to tokens")
        spec = ",".join(f"{size}={'off' if t is None else t}" for size, t in measured.items())
        return cls(by_size=cls.parse(spec).by_size)


def crossover(points: list[tuple[int, float, float]]) -> int | None:
    """The threshold that fits measured iterations best: `points` are (batched tokens, TP ms,
    SP ms); the result (None: always TP) minimizes the summed relative loss against the
    faster mode at every point. A fit, not the last point where TP won: one noisy
    measurement does not move the threshold past the points that disagree with it."""
    if not points:
        return None

    def loss(threshold: int | None) -> float:
        total = 0.0
        for tokens, tp_ms, sp_ms in points:
            sp = threshold is not None and tokens > threshold
            total += (sp_ms if sp else tp_ms) / min(tp_ms, sp_ms) - 1
        return total

    # NOTE: candidates ascend and ties keep the first, so a tie goes to TP only (None) or to
    # the smallest threshold that fits as well.
    candidates: list[int | None] = [None, 0, *sorted({t for t, _, _ in points})]
    best = min(candidates, key=loss)
    return None if best is not None and best >= max(t for t, _, _ in points) else best


def shift_rule(text: str) -> ShiftRule:
    """argparse type of `--shift-threshold` (`ShiftRule.parse`; its message on an error)."""
    try:
        return ShiftRule.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
