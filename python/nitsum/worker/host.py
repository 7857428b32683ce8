"""Build a host worker's backend: a DevicePool of N local devices and its PoolEngine."""

from __future__ import annotations

import logging
from pathlib import Path

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.load import install_grammars, load_config, model_eos_ids
from nitsum.kv.cache import KVCache
from nitsum.parallel.topology import GroupShape
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource
from nitsum.pool.pool_engine import PoolEngine
from nitsum.worker.backend import PoolBackend
from nitsum.worker.device_watch import DeviceWatch
from nitsum.worker.supervise import Restarts

log = logging.getLogger(__name__)


def open_pool_backend(
    model_dir: str | Path,
    ecfg: EngineConfig,
    num_devices: int,
    first_id: int = 0,
    restarts: Restarts | None = None,
) -> PoolBackend:
    """Start `num_devices` device processes on the model in `model_dir` (each loads the full
    weights and warms every TP context it can join); every device starts as its own TP-1 group.

    The caller owns the pool: `backend.pe.pool.close()` stops the device processes. A device
    process that dies leaves the plan and is restarted with `restarts`' backoff
    (worker/device_watch.py).
    """
    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    num_pages = KVCache.pages_in(cfg, ecfg.kv_cache_bytes, ecfg.page_tokens, ecfg.dtype)
    source = ModelSource(model_dir=str(model_dir))
    pool = DevicePool(num_devices, source, ecfg, num_pages, levels=ecfg.tp_levels)
    try:
        groups = [GroupShape.tp_group((d,)) for d in range(num_devices)]
        eos = model_eos_ids(model_dir)
        install_grammars(model_dir, eos)
        pe = PoolEngine(pool, cfg, ecfg, num_pages, groups, eos)
    except BaseException:
        pool.close()
        raise
    backend = PoolBackend(pe, first_id)
    backend.watch = DeviceWatch(pe, pool, first_id, restarts or Restarts())
    return backend
