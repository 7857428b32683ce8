"""What the controller (`DevicePool`) asks a device process (`device_proc.Device`), one
dataclass per command, and how the device answers.

They travel pickled over the device's pipe; commands to one device are answered in order, one
`Reply` each (`Stop` excepted: the device exits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from nitsum.engine.step_inputs import StepInputs
from nitsum.kv.host_tier import PageCopies
from nitsum.pool.faults import FaultPlan
from nitsum.pool.migration_plan import Piece
from nitsum.pool.nixl_agent import Read


@dataclass(frozen=True)
class Step:
    """Run one step of group `members` (its warm context; a pipeline's when the inputs name
    a stage TP). The sampling rank answers the logits, the others None."""

    members: tuple[int, ...]
    inputs: StepInputs


@dataclass(frozen=True)
class SwapStart:
    """Queue this device's shard of host-tier copies on its copy thread (`ticket` names them)."""

    ticket: int
    out: PageCopies
    into: PageCopies


@dataclass(frozen=True)
class SwapPoll:
    """The copy thread's progress, waiting for ticket `wait_for` first when given."""

    wait_for: int | None = None


@dataclass(frozen=True)
class Migrate:
    """Run the KV transfer pieces this device takes part in (a plan switch); `faults` injects
    failures (tests only, pool/faults.py), `migration` (increasing) names when a source's
    pages are ready to be read in place (pool/shared_kv.py)."""

    pieces: list[Piece]
    mode: str
    faults: FaultPlan | None
    migration: int


@dataclass(frozen=True)
class KvOut:
    """The KV blocks of the pieces this device sends to another host worker process."""

    pieces: list[Piece]


@dataclass(frozen=True)
class KvIn:
    """Scatter KV blocks from another host worker process into this device's pages."""

    pieces: list[Piece]
    blocks: list[torch.Tensor]


@dataclass(frozen=True)
class NixlOpen:
    """Register the device's KV pages with a NIXL agent of its own (once); answers (agent
    metadata, KVRegion) (pool/nixl_endpoint.py)."""


@dataclass(frozen=True)
class NixlConnect:
    """Load the peers' NIXL agent metadata (the other hosts' devices)."""

    metadata: list[bytes]


@dataclass(frozen=True)
class NixlRead:
    """Run these NIXL READs into the device's pages (KV from another host), within
    `timeout_s`; answers the bytes read, or `transfer_failed`."""

    reads: list[Read]
    timeout_s: float


@dataclass(frozen=True)
class Counters:
    """The device's counters (collectives, graph captures and replays, contexts built)."""


@dataclass(frozen=True)
class Probe:
    """Tests and benchmarks: run module-level `fn(device, *args)` on the device's state."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default=())


@dataclass(frozen=True)
class Stop:
    """Close the copy thread and leave the process group; the process exits, unanswered."""


DeviceCommand = (
    Step | SwapStart | SwapPoll | Migrate | KvOut | KvIn | NixlOpen | NixlConnect | NixlRead
    | Counters | Probe | Stop
)  # fmt: skip


@dataclass(frozen=True)
class Reply:
    """A device's answer: `ok` with the command's value, `transfer_failed` (a KV transfer
    failed; the controller rolls back) or `error` with the device's traceback."""

    status: Literal["ok", "transfer_failed", "error"]
    value: Any = None
