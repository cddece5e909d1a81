"""core.placement: the marker a compressor hands Horovod first, reduced over the optimizer's
process set, tells whether that set is the compressor's. Checked against a plain simulation of
Horovod's reduction (float32 sums, then the op's scaling) for every pair of partitions of the
ranks into optimizer and compressor sets (tests/placements.py)."""

import numpy as np
import pytest
from placements import layouts, reduced

from sparsecomm.core import placement


def raises(reduced_marker, ranks):
    try:
        placement.check("TopK", reduced_marker, ranks, None)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_a_mixed_set_of_ranks_is_refused_by_one_of_them_and_the_right_one_by_none(size):
    for optimizer_set, compressor_set_of, reductions in layouts(size):
        right = all(compressor_set_of[r] == optimizer_set for r in optimizer_set)
        for said in reductions:
            refused = [raises(said, compressor_set_of[r]) for r in optimizer_set]
            if right:
                assert not any(refused), (optimizer_set, compressor_set_of)
            else:  # one rank raising stops the job
                assert any(refused), (optimizer_set, compressor_set_of)


@pytest.mark.parametrize("size", [64, 1024, 4096])
def test_large_sets_one_rank_apart_are_told_apart(size):
    every = list(range(size))
    for optimizer_set in (every[1:], every[:-1], every[: size // 2]):  # the compressor's: every rank
        said = reduced(optimizer_set, {r: every for r in every}, 1 / len(optimizer_set))
        assert raises(said, every)
    assert not raises(reduced(every, {r: every for r in every}, 1 / size), every)
    for compressor_set in (every[1:], every[:-1]):  # the optimizer's: every rank
        of = {r: (compressor_set if r in compressor_set else [r]) for r in every}
        assert any(raises(reduced(every, of, 1 / size), of[r]) for r in every)


def test_an_op_that_is_neither_sum_nor_average_is_refused():
    ranks = [0, 1, 2]
    markers = np.array([placement.marker(r, ranks) for r in ranks])
    for op in (np.min, np.max, np.prod):
        assert raises(op(markers, axis=0).tolist(), ranks)


def test_the_message_names_the_compressor_its_ranks_and_the_remedy():
    with pytest.raises(ValueError, match=r"TopK: .*process_set with ranks \[0, 1\].*process_set=ps"):
        placement.check("TopK", [3.0, 1.0, 0.0], [0, 1], "a set")
