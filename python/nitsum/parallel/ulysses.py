"""Ulysses sequence parallelism (SP) over a TP group's ranks, with TP's KV layout.

In SP a group of `p` ranks splits the iteration's tokens into `p` contiguous chunks; each rank
runs the dense layers (QKV, o_proj, MLP) on its chunk with the device's full weights, and one
all-to-all before attention regroups the projections by head, so that rank r attends every
token with exactly the heads it owns at TP p (`HeadRange`). The KV a rank writes is therefore
the KV TP p writes, in the same pages: a group can shift between SP and TP at any iteration
with no KV movement (Shift Parallelism §3.1, "KV cache invariance"). A second all-to-all after
attention brings each rank's chunk back with every head.

NOTE: chunks are padded to a multiple of `p` (the paper's load balancing at small batch): the
padding rows run through the dense layers and are dropped before attention, so their K/V is
never written and a step with fewer tokens than ranks is still correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nitsum.config import ModelConfig
from nitsum.parallel.collectives import Collectives
from nitsum.parallel.shard import HeadRange


@dataclass(frozen=True)
class TokenSplit:
    """`tokens` rows cut into `ranks` equal chunks of `chunk` rows (the last ones padded)."""

    tokens: int
    ranks: int

    @property
    def chunk(self) -> int:
        return max(1, -(-self.tokens // self.ranks))

    @property
    def padded(self) -> int:
        return self.chunk * self.ranks

    def take(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank `rank`'s chunk of the rows of `x` (padded with zero rows at the end)."""
        lo = min(rank * self.chunk, self.tokens)
        part = x[lo : lo + self.chunk]
        if part.shape[0] == self.chunk:
            return part
        pad = x.new_zeros((self.chunk - part.shape[0], *x.shape[1:]))
        return torch.cat([part, pad])


def head_rows_by_rank(cfg: ModelConfig, p: int) -> torch.Tensor | None:
    """Index into the fused qkv output's head rows (`num_kv_heads · (r+2)` rows of head_dim,
    layout in weights/layout.py) listing, rank by rank, the rows that rank owns at TP p in its
    own fused order: per owned KV group, its query heads, then k, then v.

    None when that is the identity (every rank owns whole groups): the regrouping is a view.
    NOTE: with KV replication (p > KV heads) the k and v rows of a group appear once per
    replica rank, so the all-to-all itself replicates them (Shift Parallelism §3.2.1).
    """
    r = cfg.num_kv_groups
    rows: list[int] = []
    for rank in range(p):
        heads = HeadRange.of(cfg, p, rank)
        q_per_group = heads.q_heads // heads.kv_heads
        # Ranks own consecutive, equal blocks of q heads: the first owned q head within its
        # group (nonzero only for a replica rank that is not its group's first).
        q_offset = rank * heads.q_heads - heads.kv_start * r
        for g in range(heads.kv_start, heads.kv_start + heads.kv_heads):
            base = g * (r + 2)
            rows += [base + q_offset + i for i in range(q_per_group)] + [base + r, base + r + 1]
    if rows == list(range(cfg.num_kv_heads * (r + 2))):
        return None
    return torch.tensor(rows, dtype=torch.long)


@dataclass
class SPComm:
    """What a rank needs to run SP in its group: its collectives, its rank, the head-row index.

    Built with the warm context at start-up; nothing here is created on the step path.
    """

    ranks: int
    rank: int
    comm: Collectives
    head_rows: torch.Tensor | None
    stats: dict[str, int] = field(default_factory=lambda: {"all_to_all": 0})

    def scatter_heads(self, qkv: torch.Tensor, split: TokenSplit, head_dim: int) -> torch.Tensor:
        """(chunk, all fused head rows · hd) of this rank's tokens → (tokens, own head rows, hd)
        of every token: the all-to-all into head parallelism."""
        x = qkv.view(split.chunk, -1, head_dim)
        if self.head_rows is not None:
            x = x.index_select(1, self.head_rows)
        # (chunk, ranks · own, hd) → (ranks, chunk, own, hd): block j goes to rank j.
        send = x.view(split.chunk, self.ranks, -1, head_dim).transpose(0, 1).contiguous()
        recv = torch.empty_like(send)
        self.comm.all_to_all_single(recv, send)
        self.stats["all_to_all"] += 1
        # Rank i sent its chunk of tokens: stacking by source restores token order.
        return recv.view(split.padded, -1, head_dim)[: split.tokens]

    def gather_tokens(self, out: torch.Tensor, split: TokenSplit) -> torch.Tensor:
        """(tokens, own q heads · hd) of every token → (chunk, all q heads · hd) of this rank's
        tokens: the all-to-all back. Ranks own consecutive q heads, so source order is head
        order."""
        width = out.shape[1]
        send = out.new_zeros((split.padded, width))
        send[: split.tokens] = out
        recv = torch.empty_like(send)
        self.comm.all_to_all_single(recv, send)
        self.stats["all_to_all"] += 1
        # (ranks, chunk, width) from each source → (chunk, ranks · width).
        return recv.view(self.ranks, split.chunk, width).transpose(0, 1).reshape(split.chunk, -1)

    def gather_rows(self, x: torch.Tensor, split: TokenSplit, rows: list[int]) -> torch.Tensor:
        """Rows `rows` (step-wide indices) of every rank's chunk `x`, in the order asked: only
        those rows travel (e.g. one per prompt, not its whole chunk)."""
        owner = [(row // split.chunk, row % split.chunk) for row in rows]
        width = max(1, max(sum(1 for r, _ in owner if r == rank) for rank in range(self.ranks)))
        mine = [i for r, i in owner if r == self.rank]
        send = x.new_zeros((width, *x.shape[1:]))
        send[: len(mine)] = x[mine]
        parts = [torch.empty_like(send) for _ in range(self.ranks)]
        self.comm.all_gather(parts, send)
        taken = [0] * self.ranks
        out = []
        for r, _ in owner:
            out.append(parts[r][taken[r]])
            taken[r] += 1
        return torch.stack(out) if out else x.new_zeros((0, *x.shape[1:]))


def build_sp_comm(
    cfg: ModelConfig,
    p: int,
    rank: int,
    comm: Collectives | None,
    device: torch.device | str = "cpu",
) -> SPComm | None:
    """The SP side of a rank's warm context at level p (None for a single device)."""
    if p == 1 or comm is None:
        return None
    rows = head_rows_by_rank(cfg, p)
    return SPComm(p, rank, comm, None if rows is None else rows.to(device))
