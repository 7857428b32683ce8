"""A step's deadline: the floor plus 4x the time a fit of the measured steps expects, per
member set (pool/step_deadline.py)."""

from __future__ import annotations

import os

import pytest

from nitsum.pool.step_deadline import StepDeadline, cpu_seconds, is_stopped


def test_before_any_step_the_deadline_is_the_floor():
    d = StepDeadline(5.0)
    assert d.budget((0,), 10) == 5.0
    assert d.expected((0,), 10) == 0.0


def test_the_fit_learns_a_cost_per_step_and_per_token():
    d = StepDeadline(1.0)
    for tokens in (1, 100, 10, 400, 50, 200) * 20:
        d.observe((0, 1), tokens, 0.01 + 0.001 * tokens)
    assert d.expected((0, 1), 1000) == pytest.approx(1.01, rel=1e-6)
    assert d.budget((0, 1), 1000) == pytest.approx(1.0 + 4 * 1.01, rel=1e-6)
    assert d.expected((0,), 1000) == 0.0  # another member set has its own fit


def test_steps_of_one_size_scale_a_larger_step_in_proportion():
    d = StepDeadline(2.0)
    for _ in range(30):
        d.observe((0,), 8, 0.02)
    assert d.expected((0,), 8) == pytest.approx(0.02)
    assert d.expected((0,), 4) == pytest.approx(0.02)  # never below a step's own cost
    assert d.expected((0,), 800) == pytest.approx(2.0)


def test_recent_steps_count_most():
    d = StepDeadline(1.0)
    for _ in range(50):
        d.observe((0,), 8, 1.0)
    for _ in range(50):
        d.observe((0,), 8, 0.01)
    assert d.expected((0,), 8) < 0.02


def test_a_floor_must_be_positive():
    with pytest.raises(ValueError, match="> 0"):
        StepDeadline(0.0)


def test_a_running_process_is_not_stopped():
    assert not is_stopped(os.getpid())
    assert not is_stopped(None)


def test_cpu_seconds_count_this_process_work():
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds(os.getpid()) > before
    assert cpu_seconds(None) == 0.0
