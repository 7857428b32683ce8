"""A recording cut at each collective that cannot be captured (engine/graphs.py `Recording`,
parallel/capture_cuts.py): the segments it makes and the order a replay runs them in. CUDA
graphs need a GPU, so a stand-in graph logs what capture and replay do; the collective is the
real `SharedCollectives.all_reduce` of a one-member group (no peer to wait for)."""

from __future__ import annotations

import pytest
import torch

from nitsum.engine import graphs
from nitsum.parallel.shared_collectives import SharedCollectives
from nitsum.parallel.shared_memory import supported

pytestmark = pytest.mark.skipif(not supported(), reason="shared memory needs Linux on x86-64")


class LoggedGraph:
    """Logs capture_begin / capture_end / replay into one shared list."""

    log: list[str] = []
    made = 0

    def __init__(self) -> None:
        LoggedGraph.made += 1
        self.name = f"g{LoggedGraph.made}"
        self.pool = None

    def capture_begin(self, pool: object = None) -> None:
        self.pool = pool
        LoggedGraph.log.append(f"begin {self.name}")

    def capture_end(self) -> None:
        LoggedGraph.log.append(f"end {self.name}")

    def replay(self) -> None:
        LoggedGraph.log.append(f"replay {self.name}")


def test_a_shared_collective_cuts_the_recording_and_runs_between_graphs(monkeypatch):
    monkeypatch.setattr(graphs.torch.cuda, "CUDAGraph", LoggedGraph)
    LoggedGraph.log, LoggedGraph.made = [], 0
    comm = SharedCollectives((0,), 0, "cpu", 4096)
    comm.attach([comm.handle()])
    x = torch.ones(8)
    ran: list[str] = []

    def step() -> torch.Tensor:  # two layers' worth: two collectives between three pieces
        ran.append("piece")
        comm.all_reduce(x)
        ran.append("piece")
        comm.all_reduce(x)
        ran.append("piece")
        return x

    reduce = comm._all_reduce

    def logged_reduce(t: torch.Tensor) -> None:
        LoggedGraph.log.append("all_reduce")
        reduce(t)

    comm._all_reduce = logged_reduce  # type: ignore[method-assign]
    rec = graphs.Recording.__new__(graphs.Recording)
    rec.segments, rec.fn = [], step
    rec.out = out = rec._capture(step, pool="the-pool")
    # Capture: three graphs, closed at each collective, none of which ran (0 rounds).
    assert LoggedGraph.log == ["begin g1", "end g1", "begin g2", "end g2", "begin g3", "end g3"]
    assert comm.stats["rounds"] == 0 and rec.cuts == 2 and out is x
    assert all(g.pool == "the-pool" for g, _ in rec.segments)  # one memory pool for all
    # Replay: graph, collective, graph, collective, graph.
    LoggedGraph.log = []
    rec.replay()
    assert LoggedGraph.log == ["replay g1", "all_reduce", "replay g2", "all_reduce", "replay g3"]
    assert comm.stats["rounds"] == 2 and ran == ["piece"] * 3  # the pieces ran once, captured
