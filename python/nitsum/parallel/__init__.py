"""Tensor parallelism as runtime state: shard views, warm contexts, communicator pool."""
