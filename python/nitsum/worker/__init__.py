"""Device workers: the ZeroMQ server around one engine, or around a pool of local devices with
runtime TP switching (docs/protocol.md, docs/serving.md)."""

from nitsum.worker.backend import EngineBackend, PoolBackend
from nitsum.worker.server import WorkerServer

__all__ = ["EngineBackend", "PoolBackend", "WorkerServer"]
