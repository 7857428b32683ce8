"""Device workers: the ZeroMQ server around a PoolEngine over one in-process device or a pool
of local device processes, with runtime TP switching (docs/protocol.md, docs/serving.md)."""

from nitsum.worker.backend import PoolBackend
from nitsum.worker.server import WorkerServer

__all__ = ["PoolBackend", "WorkerServer"]
