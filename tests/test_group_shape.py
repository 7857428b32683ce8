"""GroupShape: one type for a group of devices (TP group or pipeline), its derived degrees, and
the plans, pipelines and faults built on it."""

from __future__ import annotations

import pytest

from nitsum.parallel.topology import GroupShape, TPTopology
from nitsum.pool.faults import FaultPlan, SwitchFault
from nitsum.worker.assignment import local_plan
from nitsum.worker.protocol import GroupPlan
from shapes import tp


def test_shapes_derive_their_stages_and_compare_by_value() -> None:
    tp4 = tp(0, 1, 2, 3)
    assert (tp4.tp, tp4.pp, tp4.size, tp4.is_pipeline) == (4, 1, 4, False)
    pipe = GroupShape.pipeline((4, 5, 6, 7), 2)
    assert (pipe.tp, pipe.pp, pipe.is_pipeline) == (2, 2, True)
    assert [pipe.stage(s) for s in range(pipe.pp)] == [(4, 5), (6, 7)]
    # A "pipeline" of one stage is the TP group itself: one shape, not two spellings.
    assert GroupShape.pipeline((0, 1, 2, 3), 4) == tp4
    assert len({tp4, GroupShape((0, 1, 2, 3), 4, 1), pipe}) == 2
    assert GroupShape() == GroupShape((0,), 1, 1)


def test_shapes_key_engines_and_sort_by_their_devices() -> None:
    """Engines are keyed by shape: the same devices as TP 4 and as 2x2 are two keys, and
    shapes sort as the members tuples they replaced (then tp, then pp)."""
    tp4, pipe = tp(0, 1, 2, 3), GroupShape((0, 1, 2, 3), 2, 2)
    engines = {tp4: "tp4", pipe: "pipe"}
    assert engines[tp(0, 1, 2, 3)] == "tp4" and len(engines) == 2
    groups = [GroupShape.tp_group(m) for m in [(2, 3), (0,), (1,)]] + [pipe, tp4]
    assert [(g.members, g.tp) for g in sorted(groups)] == [
        ((0,), 1),
        ((0, 1, 2, 3), 2),
        ((0, 1, 2, 3), 4),
        ((1,), 1),
        ((2, 3), 2),
    ]
    assert (pipe.leader, pipe.holds(3), pipe.holds(4)) == (0, True, False)
    assert tp4.overlaps(tp(3)) and GroupShape((1,)).within(tp4)
    with pytest.raises(AttributeError):
        tp4.tp = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "members, tp, pp", [((0, 1, 2), 2, 2), ((0, 1), 0, 2), ((0, 1), 2, 0), ((), 1, 1)]
)
def test_a_shape_whose_members_are_not_its_stages_is_refused(members, tp, pp) -> None:
    with pytest.raises(ValueError):
        GroupShape(members, tp, pp)


def test_pipeline_refuses_a_partial_stage() -> None:
    with pytest.raises(ValueError, match="not whole stages"):
        GroupShape.pipeline((0, 1, 2), 2)


def test_the_topology_lists_pipelines_as_shapes() -> None:
    topo = TPTopology(4, (1, 2, 4))
    assert topo.pipelines(4, (2, 4)) == [
        GroupShape((0, 1), 1, 2),
        GroupShape((2, 3), 1, 2),
        GroupShape((0, 1, 2, 3), 2, 2),
        GroupShape((0, 1, 2, 3), 1, 4),
    ]
    assert topo.pipelines(2, (2, 4)) == topo.pipelines(2, (2,))  # 4 stages need 4 layers


def test_a_local_plan_carries_each_groups_shape() -> None:
    groups = [
        GroupPlan([2, 3, 4, 5], 2, "mixed", [], True, pp=2),
        GroupPlan([0, 1], 2, "mixed", [], True),
    ]
    plan = local_plan([0, 1, 2, 3, 4, 5, 6], groups)
    assert plan.groups == [
        GroupShape((0, 1), 2, 1),
        GroupShape((2, 3, 4, 5), 2, 2),
        GroupShape((6,), 1, 1),  # left out by the plan: a TP-1 group of its own
    ]


def test_a_fault_plan_names_one_piece_and_one_phase() -> None:
    assert FaultPlan().stop_chunk(0) is None
    faults = FaultPlan(transfer=(1, 3), phase="commit")
    assert (faults.stop_chunk(0), faults.stop_chunk(1)) == (None, 3)
    faults.check("plan")  # other phases pass
    with pytest.raises(SwitchFault, match="commit"):
        faults.check("commit")
    with pytest.raises(ValueError, match="unknown switch phase"):
        FaultPlan(phase="comit")
