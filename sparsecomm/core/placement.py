"""Whether Horovod reduces a compressor's placeholder over the compressor's own ranks.

A per-rank-coordinate exchange gathers over the compressor's process set, while Horovod reduces
the placeholder it hands back over the optimizer's. Given different sets, the gathers of two
sets with the same settings would join each other (one gradient summed over both), or each set
would average alone: wrong without an error. So the placeholder is a marker of three elements,
[1, is this rank its set's first, the set's first rank], and its reduction is checked: over the
compressor's own N ranks it comes back as c * [N, 1, N * first], whatever Horovod's op scaling c
(Sum, Average, pre- and postscale). Any other set of ranks fails the check on at least one of
them (tests/compressors/test_placement.py tries every pair of partitions of up to 5 ranks),
which stops the job.
"""


def marker(rank, ranks):
    """This rank's marker: `rank` its global rank, `ranks` the global ranks of its process set."""
    first = min(ranks)
    return [1.0, float(rank == first), float(first)]


def agrees(scale, firsts, first_ranks, ranks):
    """Whether a reduced marker, c * [M, how many ranks came first, the sum of their firsts], came
    from exactly `ranks`. The sums are integers times c, and c is `firsts` when exactly one rank
    came first: half of it tells them apart. (TF's graph checks with one op, SparsecommCheckedScale,
    which tests/ops/test_tf_select_ops.py holds to this rule.)"""
    return abs(scale - len(ranks) * firsts) < 0.5 * firsts and abs(first_ranks - scale * min(ranks)) < 0.5 * firsts


def refusal(owner, ranks, process_set):
    """The error's text: `process_set` as the user gave it (None: every rank)."""
    given = "process_set=None, every rank" if process_set is None else f"process_set with ranks {list(ranks)}"
    return (
        f"{owner}: Horovod reduced the compressor's placeholder over other ranks than the compressor's "
        f"({given}), or with an op other than hvd.Sum or hvd.Average: give the compressor the "
        f"optimizer's process set (hvd.DistributedOptimizer(..., process_set=ps, compression="
        f"{owner}(..., process_set=ps)))"
    )


def check(owner, reduced, ranks, process_set):
    """Raises ValueError where the reduced marker (`reduced`, three floats) did not come from
    exactly the compressor's `ranks`."""
    if not agrees(*reduced, ranks):
        raise ValueError(f"{refusal(owner, ranks, process_set)}; reduced marker {[round(v, 6) for v in reduced]}")
