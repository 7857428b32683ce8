"""The device pool: one process per device, the pool engine over them, and KV moves between
devices (the orchestration above the engine; TP building blocks are in `nitsum.parallel`)."""
