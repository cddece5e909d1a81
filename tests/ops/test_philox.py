"""The counter-based generator behind shared-seed selection: the reference against the
published Philox4x32-10 known-answer vectors, and the compiled op against the reference."""

import pytest
from reference import block_start, philox4x32_10

# Random123's kat_vectors for philox4x32_10.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_reference_philox_matches_known_answers(counter, key, expected):
    assert philox4x32_10(counter, key) == expected


def test_torch_op_matches_reference():
    from sparsecomm.torch import ops

    cases = [(0, 0, 0, 1), (42, 7, 0, 10), (2**64 - 1, 2**32 - 1, 2**40 + 3, 25_557_032), (123, 99, 5, 0)]
    cases += [(s, t, st, n) for s in (1, 2**63) for t in (0, 12345) for st in (0, 1, 2**32) for n in (2, 3, 1000003)]
    for seed, tid, step, numel in cases:
        assert ops.random_block_start(seed, tid, step, numel) == block_start(seed, tid, step, numel), (
            seed,
            tid,
            step,
            numel,
        )


def test_starts_are_spread_over_the_tensor():
    """Over many steps the start covers the tensor about uniformly (no stuck stream)."""
    from sparsecomm.torch import ops

    numel, steps = 10, 5000
    hits = [0] * numel
    for step in range(steps):
        hits[ops.random_block_start(9, 3, step, numel)] += 1
    assert min(hits) > 0.8 * steps / numel and max(hits) < 1.2 * steps / numel, hits
