"""RoundLayout: capacity checks, and every protocol's layout packs exactly the integers sent before it."""
import itertools

import pytest

from secureflhv.horizontal.fl import AGG_ROUNDS, PARTS_PER_ROUND
from secureflhv.secagg.exchange import ENVELOPE_ROUNDS, STAGES, envelope_round
from secureflhv.transport.round_layout import RoundLayout
from secureflhv.tree.rounds import DEPTH_SLOTS, LEVEL_ROUNDS, level_round
from secureflhv.tree.vertical import MAX_ROW_PARTS, _part_rnd
from secureflhv.vertical import lr, split_nn
from secureflhv.vertical.common import BATCH_ROUNDS, MAX_BATCHES

BIG = [0, 1, 2, 7, 1000, 123_456_789]


def test_fl_aggregation_rounds_unchanged():
    for r, part in itertools.product(BIG, range(PARTS_PER_ROUND)):
        assert AGG_ROUNDS.pack(round=r, part=part) == r * 8 + part
    with pytest.raises(ValueError, match=r"horizontal FL aggregation round key: part = 8 .*part < 8"):
        AGG_ROUNDS.pack(round=1, part=8)


def test_secagg_envelope_rounds_unchanged():
    for rid, stage in itertools.product(BIG + [8 * 5 + 3], range(STAGES)):
        assert envelope_round(rid, stage) == rid * 16 + stage == ENVELOPE_ROUNDS.pack(round_id=rid, stage=stage)
    with pytest.raises(ValueError, match="stage = 16"):
        envelope_round(3, 16)


def test_tree_level_and_row_part_rounds_unchanged():
    for tree, depth in itertools.product(BIG, range(DEPTH_SLOTS - 1)):
        assert level_round(tree, depth) == tree * 64 + depth + 1 == LEVEL_ROUNDS.pack(tree=tree, level=depth + 1)
    with pytest.raises(ValueError, match="tree level round key: level = 64"):
        level_round(2, 63)
    for tree, part in itertools.product(BIG, [0, 1, 17, MAX_ROW_PARTS - 1]):
        assert _part_rnd(tree, part) == tree * 4096 + part + 1
    with pytest.raises(ValueError, match="part = 4096"):
        _part_rnd(0, MAX_ROW_PARTS)


@pytest.mark.parametrize("mod", [lr, split_nn])
def test_vertical_batch_rounds_unchanged(mod):
    for e, b, s in itertools.product([0, 1, 5, 40_000], [0, 1, 99, MAX_BATCHES - 1], range(10)):
        assert mod.round_id(e, b, s) == e * 10 * 1_000_000 + b * 10 + s
    assert mod.MAX_BATCHES == MAX_BATCHES
    with pytest.raises(ValueError, match=r"vertical batch round key: batch = 1000000"):
        mod.round_id(0, MAX_BATCHES, 0)
    with pytest.raises(ValueError, match="step = 10"):
        mod.round_id(0, 0, 10)


def test_pack_is_strictly_increasing_and_unpacks():
    keys = [BATCH_ROUNDS.pack(epoch=e, batch=b, step=s) for e in range(3) for b in (0, 1, MAX_BATCHES - 1)
            for s in range(10)]
    assert keys == sorted(set(keys))
    assert BATCH_ROUNDS.unpack(BATCH_ROUNDS.pack(epoch=4, batch=12, step=3)) == {"epoch": 4, "batch": 12, "step": 3}


def test_layout_errors():
    with pytest.raises(ValueError, match="negative|out of range"):
        AGG_ROUNDS.pack(round=-1, part=0)
    with pytest.raises(ValueError, match="fields"):
        AGG_ROUNDS.pack(round=1)
    with pytest.raises(TypeError):
        AGG_ROUNDS.pack(round=1.5, part=0)
    with pytest.raises(ValueError, match="unbounded"):
        RoundLayout("x", (("a", 4), ("b", 2)))
    with pytest.raises(ValueError, match="capacity"):
        RoundLayout("x", (("a", None), ("b", None)))
    assert AGG_ROUNDS.capacity("part") == PARTS_PER_ROUND
