"""The pool's TP topology: levels a model allows and a pool holds, aligned groups, checks."""

from __future__ import annotations

import pytest

from nitsum.config import ModelConfig
from nitsum.parallel.topology import GroupShape, TPTopology
from tiny import BASE


def cfg(heads: int, kv_heads: int, intermediate: int = 576) -> ModelConfig:
    hf = dict(BASE, num_attention_heads=heads, num_key_value_heads=kv_heads)
    hf |= {"intermediate_size": intermediate, "hidden_size": 64 * heads // 8 or 64}
    return ModelConfig.from_hf(hf | {"architectures": ["LlamaForCausalLM"]})


def test_levels_are_what_the_model_allows_and_the_pool_holds() -> None:
    smollm_like = cfg(9, 3)  # SmolLM2-135M: 9 query heads, 3 KV heads
    assert TPTopology.of(smollm_like, 4).levels == (1, 3)
    assert TPTopology.of(smollm_like, 2).levels == (1,)
    # 8 replicates each of the 4 KV heads on 2 ranks; (4, 2) stops at 4 (query heads).
    assert TPTopology.of(cfg(8, 4), 8).levels == (1, 2, 4, 8)
    assert TPTopology.of(cfg(4, 2), 8).levels == (1, 2, 4)
    assert TPTopology.of(cfg(8, 4), 8, candidates=(2,)).levels == (1, 2)


def test_aligned_groups_and_a_devices_group() -> None:
    t = TPTopology(6, (1, 2, 4))
    tp = GroupShape.tp_group
    assert t.aligned_groups() == [tp((0, 1)), tp((2, 3)), tp((4, 5)), tp((0, 1, 2, 3))]
    assert t.group_of(5, 2) == tp((4, 5)) and t.group_of(3, 4) == tp((0, 1, 2, 3))
    assert t.group_of(3, 4).tp == 4
    assert TPTopology(3, (1, 3)).aligned_groups() == [tp((0, 1, 2))]


@pytest.mark.parametrize(
    ("groups", "error"),
    [
        ([(1, 2)], "not an aligned block"),
        ([(0, 1, 2)], "TP 3 not in the allowed levels"),
        ([(0, 1), (1,)], "overlaps"),
        ([(4, 5)], "not an aligned block of the 4-device pool"),
    ],
)
def test_check_refuses_what_the_pool_cannot_run(groups, error) -> None:
    with pytest.raises(ValueError, match=error):
        TPTopology(4, (1, 2, 4)).check([GroupShape.tp_group(g) for g in groups])


def test_check_reads_tp_from_the_shape_not_the_member_count() -> None:
    # Four devices as 2 stages of TP 2: a pipeline, not a TP-4 group (4 = len(members)).
    with pytest.raises(ValueError, match="a pipeline, not a TP group"):
        TPTopology(4, (1, 2, 4)).check([GroupShape((0, 1, 2, 3), 2, 2)])


def test_check_accepts_a_mixed_layout() -> None:
    layout = [(0, 1, 2, 3), (4, 5), (6,), (7,)]
    TPTopology(8, (1, 2, 4)).check([GroupShape.tp_group(g) for g in layout])
