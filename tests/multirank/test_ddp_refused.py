"""What ddp_hook refuses under torchrun --nproc_per_node 2 (tests/workers/ddp_refused.py): a
settings mismatch across ranks and sparse gradients, each refused with a clear error on every
rank, and no rank left waiting (the launch ends well within its time-out)."""

import pytest
from launch import torchrun_outcome

CASES = {
    "mismatch": r"TopK: compressor settings differ across ranks (rank 0: TopK(",
    "sparse": r"TopK: ddp_hook got a bucket of sparse gradients (shapes [[100, 8]])",
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_refuses_and_none_hangs(case):
    code, output, seconds = torchrun_outcome(2, "ddp_refused.py", "--case", case, timeout=120)
    assert code != 0
    for rank in range(2):
        assert f"rank {rank} refused: {CASES[case]}" in output, output[-3000:]
    assert "stepped" not in output
