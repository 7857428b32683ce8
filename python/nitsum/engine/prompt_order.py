"""The order prompts of one class get a step's token budget in: first come, first served,
except that short prompts go ahead of long ones that can spare the tokens.

NOTE (fairness, issue 11): under plain FCFS one 8k-token prompt holds the whole budget for 16
steps of 512 tokens and every short prompt behind it waits for all of them. Here a *short*
prompt (at most half a budget left) may overtake a *long* one, up to what the long one can
spare this step:
- a long prompt with a TTFT deadline spares only what keeps its first token in time at the
  slowest recent full step (`deadline_spare`): overtaking never costs it its SLO;
- a long prompt without one (no TTFT target, or the background class, where demoted and
  background prompts have no SLO left to keep) spares half a budget: it still gets at least
  half of every step, so it finishes at most about twice as late and is never starved.
Shorts keep their own FCFS order (the first that does not fit stops the overtaking). The
simulator's local scheduler orders prompts the same way (scheduler-rs/src/sim/prompt_order.rs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def overtaking_order(
    fcfs: Iterable[T],
    remaining: Callable[[T], int],
    spare: Callable[[T, int], int],
    short_max: int,
) -> list[T]:
    """`fcfs` reordered: shorts (`remaining <= short_max`) that overtake, then the rest in
    FCFS order. `spare(long, ahead)` is what a long prompt with `ahead` tokens before it in
    FCFS order can give up this step."""
    jump: list[T] = []
    rest: list[T] = []
    room: int | None = None  # what every long prompt seen so far can still give up
    ahead = 0
    for p in fcfs:
        n = remaining(p)
        ahead_of_p = ahead
        ahead += n
        if n <= short_max and room is not None and n <= room:
            jump.append(p)
            room -= n
            continue
        if n <= short_max and room is not None:
            room = 0  # shorts stay in FCFS order among themselves
        if n > short_max:
            s = spare(p, ahead_of_p)
            room = s if room is None else min(room, s)
        rest.append(p)
    return jump + rest


def deadline_spare(
    now: float, deadline: float, step_s: float, per_step: int, ahead: int, left: int
) -> int:
    """Tokens a prompt with `left` tokens to prefill and `ahead` before it can let go first
    while its first token still comes by `deadline`, when each step of `step_s` gives prompts
    `per_step` tokens."""
    steps = math.floor((deadline - now) / step_s)
    return max(0, steps * per_step - ahead - left)
