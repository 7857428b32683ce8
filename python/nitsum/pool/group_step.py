"""One iteration over a pool's groups: launch every group's step, then collect each.

Groups run concurrently on their devices: all are launched before any is collected. A group
whose step fails fails only its own requests (with an error output); the others carry on.
The PoolEngine (pool_engine.py) wraps this with what happens between iterations: bindings
forming and releasing (pool/binding.py) and the P/D hand-off (pd_handoff.py).
"""

from __future__ import annotations

import logging
import time

from nitsum.engine.engine import Engine
from nitsum.engine.overlap import LaunchFailed
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.runner import sample_batch
from nitsum.engine.scheduled import Scheduled
from nitsum.pool.binding import Binder
from nitsum.pool.device_pool import DeviceError
from nitsum.pool.devices import Devices

log = logging.getLogger(__name__)

Group = tuple[int, ...]


def step_groups(pool: Devices, engines: dict[Group, Engine], binder: Binder) -> list[RequestOutput]:
    """One step on every active group (the plan's `engines` not lent to a formed binding,
    and the bindings'); returns their outputs, failed requests' errors included."""
    paused = binder.paused()
    active = [(g, e) for g, e in engines.items() if g not in paused]
    launched: list[tuple[tuple[int, ...], Engine, list[Scheduled]]] = []
    outputs: list[RequestOutput] = []
    started = time.monotonic()
    for members, engine in active + binder.active():
        if engine.driver is not None:  # a one-device pool's overlapped steps
            try:
                outputs += engine.step()
            except Exception as e:  # noqa: BLE001 - a failing step fails its group
                cause = e.__cause__ if isinstance(e, LaunchFailed) else e
                log.error("group %s failed a step: %s", members, cause)
                if isinstance(e, LaunchFailed):
                    outputs += e.outputs  # the step before's tokens still count
                why = f"engine step failed: {type(cause).__name__}: {cause}"  # as LocalDevice's
                outputs += fail_all(engine, why)
            continue
        try:
            batch = engine.begin_step()
        except (DeviceError, RuntimeError) as e:
            # NOTE: e.g. a swap copy failed: this group's requests fail, and the groups
            # already launched are still collected (their devices' replies keep order).
            log.error("group %s failed to begin a step: %s", members, e)
            outputs += fail_all(engine, f"engine step failed: {e}")
            continue
        if batch:
            try:
                pool.launch_step(members, engine.runner.prepare(batch))
            except DeviceError as e:  # e.g. a member's process is gone: nothing was sent
                log.error("group %s could not start a step: %s", members, e)
                if set(members) & pool.down:
                    continue  # NOTE: not failed: lose_device hands them to the router
                outputs += fail_batch(engine, batch, f"engine step failed: {e}")
                continue
            launched.append((members, engine, batch))
    for members, engine, batch in launched:
        try:
            logits = pool.collect_step(members)
        except DeviceError as e:
            # A failing group fails only its own requests; the other groups carry on.
            log.error("group %s failed a step: %s", members, e)
            if set(members) & pool.down:
                continue  # NOTE: not failed: lose_device hands them to the router
            why = f"engine step failed: {str(e).strip().splitlines()[-1]}"
            outputs += fail_batch(engine, batch, why)
            continue
        # Groups run concurrently: each one's step ends by its collect.
        if not engine.shape.is_pipeline:
            ms = (time.monotonic() - started) * 1e3
            binder.chooser.observe(len(members), batch, ms)
        tokens = sample_batch(logits, batch)
        outputs += engine.end_step(batch, tokens, time.monotonic() - started)
    return outputs


def fail_batch(engine: Engine, batch: list[Scheduled], why: str) -> list[RequestOutput]:
    """End the requests of a step that failed with an error."""
    return [
        RequestOutput(item.seq.request_id, [], "error", why)
        for item in batch
        if engine.abort(item.seq.request_id)
    ]


def fail_all(engine: Engine, why: str) -> list[RequestOutput]:
    """End every request of `engine` with an error."""
    outputs = []
    for rid in engine.request_ids():
        engine.abort_or_forget(rid)
        outputs.append(RequestOutput(rid, [], "error", why))
    return outputs
