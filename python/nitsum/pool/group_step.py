"""One iteration over a pool's groups: launch every group's step, then collect each.

Groups run concurrently on their devices: all are launched before any is collected. A group
whose step fails fails only its own requests (with an error output); the others carry on.
A group whose step is late (a device hung or stopped) stays in flight across iterations when
the caller allows it (`carry`): the other groups collect as they finish and launch again, so
they do not wait on it; at its deadline its devices are killed and lost (pool/step_deadline.py).
The PoolEngine (pool_engine.py) wraps this with what happens between iterations: bindings
forming and releasing (pool/binding.py) and the P/D hand-off (pd_handoff.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from nitsum.engine.engine import Engine
from nitsum.engine.overlap import LaunchFailed
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.runner import sample_batch
from nitsum.engine.scheduled import Scheduled
from nitsum.parallel.topology import GroupShape
from nitsum.pool.binding import Binder
from nitsum.pool.device_pool import DeviceError, DevicePool
from nitsum.pool.devices import Devices

log = logging.getLogger(__name__)

# How long an iteration with nothing to collect waits on late groups before it returns (so
# the worker handles its messages meanwhile).
IDLE_WAIT_S = 0.05


@dataclass
class InFlight:
    """A group's launched step, not collected yet."""

    engine: Engine
    batch: list[Scheduled]
    started: float


def step_groups(
    pool: Devices,
    engines: dict[GroupShape, Engine],
    binder: Binder,
    carry: dict[GroupShape, InFlight] | None = None,
) -> list[RequestOutput]:
    """One step on every active group (the plan's `engines` not lent to a formed binding,
    and the bindings'); returns their outputs, failed requests' errors included.

    `carry`: the steps still in flight from the last iteration; this iteration collects them
    when they finish and leaves in it the steps that are late now (None: collect all)."""
    paused = binder.paused()
    active = [(g, e) for g, e in engines.items() if g not in paused]
    pending: dict[GroupShape, InFlight] = {}
    if carry is not None:
        pending, carry_out = dict(carry), carry
        carry_out.clear()
    outputs: list[RequestOutput] = []
    started = time.monotonic()
    for group, engine in active + binder.active():
        members = group.members
        if group in pending:
            continue  # NOTE: still in flight from an earlier iteration
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
            pending[group] = InFlight(engine, batch, started)
    if carry is None or not isinstance(pool, DevicePool):
        for group, step in pending.items():
            outputs += _collect(pool, group, step, binder)
        return outputs
    return outputs + _collect_ready(pool, pending, binder, carry)


def _collect_ready(
    pool: DevicePool,
    pending: dict[GroupShape, InFlight],
    binder: Binder,
    carry: dict[GroupShape, InFlight],
) -> list[RequestOutput]:
    """Collect the steps of `pending` as they finish; those late (past their patience, when
    every other one is in) stay in `carry`, and those past their deadline fail here."""
    outputs: list[RequestOutput] = []
    begun = time.monotonic()
    while pending:
        now = time.monotonic()
        ready = [g for g in pending if pool.step_ready(g.members) or pool.overdue(g.members)]
        for group in ready:
            outputs += _collect(pool, group, pending.pop(group), binder)
        if not pending:
            break
        now = time.monotonic()
        patience = [pool.step_patience(g.members) for g in pending]
        late = all(now >= t for t in patience)
        if late and (outputs or now - begun >= IDLE_WAIT_S):
            carry.update(pending)  # NOTE: late: the others do not wait on them
            break
        wake = [t for t in patience if t > now] + [pool.step_due(g.members) for g in pending]
        if late:
            wake.append(begun + IDLE_WAIT_S)
        pool.wait_steps([g.members for g in pending], min(wake) - now)
    return outputs


def collect_all(
    pool: Devices, carry: dict[GroupShape, InFlight], binder: Binder
) -> list[RequestOutput]:
    """Wait for every step of `carry` (each at most to its deadline) and end it."""
    outputs: list[RequestOutput] = []
    while carry:
        group, step = carry.popitem()
        outputs += _collect(pool, group, step, binder)
    return outputs


def _collect(
    pool: Devices, group: GroupShape, step: InFlight, binder: Binder
) -> list[RequestOutput]:
    """End one group's step: its tokens, or its requests failed (or handed back if a member
    is gone)."""
    engine, batch, members = step.engine, step.batch, group.members
    try:
        logits = pool.collect_step(members)
    except DeviceError as e:
        # A failing group fails only its own requests; the other groups carry on.
        log.error("group %s failed a step: %s", members, e)
        if set(members) & pool.down:
            return []  # NOTE: not failed: lose_device hands them to the router
        why = f"engine step failed: {str(e).strip().splitlines()[-1]}"
        return fail_batch(engine, batch, why)
    # Groups run concurrently: each one's step ends by its collect.
    if not group.is_pipeline:
        ms = (time.monotonic() - step.started) * 1e3
        binder.chooser.observe(group.tp, batch, ms)
    tokens = sample_batch(logits, batch)
    return engine.end_step(batch, tokens, time.monotonic() - step.started)


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
