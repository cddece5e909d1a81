"""An allocation-free steady state: after warm-up, no compressor or exchange allocates
anything near the size of the gradient per step, and decompress hands back the gradient
buffer that compress received (the result is written there). Recorded on 2 ranks under
horovodrun by tests/workers/torch_allocations.py (every op's new output storage, counted
by a TorchDispatchMode). Per-step allocations of O(k) (the selected values, the wire
buffer, what arrives) are expected: k is 1% of the tensor here."""

import pytest
from launch import horovodrun, saved_ranks

CONFIGS = (
    "RandomBlock",
    "RandomK",
    "TopK_allgather",
    "RTopK_allgather",
    "Threshold_allgather",
    "Threshold_fp16",
    "Threshold_2bit",
    "DGC_allgather_clipped",
    "DGC_allgather_clipped_bfloat16",
    "DGC_dense_clipped_float16",
    "DGC_dense",
    "DGC_spardl",
    "TopK_spardl",
)
LIMIT = 0.1  # of the gradient's dense bytes: the O(k) buffers of 2 ranks at 1% stay well below


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return saved_ranks(tmp_path_factory, horovodrun, 2, "torch_allocations.py", timeout=240)


@pytest.mark.parametrize("config", CONFIGS)
def test_no_dense_sized_allocation_after_warmup(runs, config):
    for rank, run in enumerate(runs):
        got = run[config]
        assert got["largest_bytes"] < LIMIT * got["dense_bytes"], (
            f"rank {rank}, {config}: {got['largest_op']} allocated {got['largest_bytes']} bytes, the gradient "
            f"has {got['dense_bytes']}"
        )
        assert got["in_place"], f"rank {rank}, {config}: decompress did not return the gradient buffer"
