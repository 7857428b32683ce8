"""Device worker: the ZeroMQ server around one engine (docs/protocol.md, docs/serving.md)."""

from nitsum.worker.server import WorkerServer

__all__ = ["WorkerServer"]
