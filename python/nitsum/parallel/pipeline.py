"""Pipeline parallelism as runtime state: a rank's layer range, like its head range, is a view.

A (tp, pp) group is `pp` stages of `tp` devices, its members stage-major: stage s is
members[s·tp : (s+1)·tp], an aligned TP group (its communicator already exists), and owns the
contiguous layers `stage_layers(L, pp, s)`. Activations go stage to stage point-to-point, each
TP rank to the same TP rank of the next stage (every rank of a stage holds the full hidden
state after its all-reduces), so no extra communicator is created: over the world process
group, or through the sender's staging buffers where the host's devices map them
(parallel/shared_channel.py; the only way where device processes share a GPU). Every device
keeps the full weights and a KV page for every layer: a stage computes and writes only its
layers (ReMP §3.4, §3.5 with nothing reloaded).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nitsum.parallel.shared_channel import SharedChannel

# Pipeline depths a pool may run (with any TP level per stage), when the devices allow.
DEFAULT_PP_LEVELS: tuple[int, ...] = (2, 4)


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layers stage `stage` of `pp` owns: contiguous, sizes differing by at most one."""
    if not 0 <= stage < pp or pp > num_layers:
        raise ValueError(f"stage {stage} of {pp} for a {num_layers}-layer model")
    return range(stage * num_layers // pp, (stage + 1) * num_layers // pp)


@dataclass
class Stage:
    """One rank's place in a pipeline: its stage, its layers and its neighbours (device ids of
    the same TP rank in the previous and next stage; None at the ends)."""

    index: int
    count: int
    layers: range
    prev: int | None
    next: int | None
    # This device's staging, mapped by its peers: activations go through it (None: over the
    # world process group).
    channel: SharedChannel | None = None
    # Sends in flight this step; `finish` waits for them (see `send`).
    pending: list[dist.Work] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=lambda: {"p2p_sends": 0})

    @property
    def first(self) -> bool:
        return self.prev is None

    @property
    def last(self) -> bool:
        return self.next is None

    def recv(self, rows: int, width: int, like: torch.Tensor) -> torch.Tensor:
        """The previous stage's hidden states for `rows` tokens (blocks until they arrive)."""
        assert self.prev is not None
        h = like.new_empty((rows, width))
        if self.channel is not None:
            self.channel.recv(self.prev, h)
        else:
            dist.recv(h, src=self.prev)
        return h

    def send(self, h: torch.Tensor) -> None:
        """Hand `h` to the next stage without waiting: this stage goes on with its next
        micro-batch while the next stage computes this one.

        NOTE: `h` must not be written until `finish`; it is the step's own tensor. (Through a
        channel, `h` is copied into the staging before this returns.)
        """
        assert self.next is not None
        self.stats["p2p_sends"] += 1
        if self.channel is not None:
            self.channel.send(self.next, h.contiguous())
            return
        work = dist.isend(h.contiguous(), dst=self.next)
        assert work is not None  # None only outside the group; this is the default (world) one
        self.pending.append(work)

    def finish(self) -> None:
        """Wait for this step's sends (the receivers have them)."""
        for work in self.pending:
            work.wait()
        self.pending.clear()


def build_stage(
    num_layers: int,
    tp: int,
    members: tuple[int, ...],
    device: int,
    channel: SharedChannel | None = None,
) -> Stage | None:
    """The stage of `device` in the group `members` of `len(members) // tp` stages (None for a
    single stage: a plain TP group); `channel`: this device's staging, if activations go
    through the senders' staging buffers."""
    pp = len(members) // tp
    if pp == 1:
        return None
    i = members.index(device)
    s = i // tp
    prev = members[i - tp] if s > 0 else None
    nxt = members[i + tp] if s < pp - 1 else None
    return Stage(s, pp, stage_layers(num_layers, pp, s), prev, nxt, channel)
