"""Host reads on the hot path: every read of tensor data on the host (item, float(), int(),
bool(), tolist, numpy) that compress + decompress make, per compressor, on 2 ranks under
horovodrun (tests/workers/torch_host_reads.py records them with a TorchFunctionMode).

On a GPU each such read is a synchronisation of the host with the device. The budget below is
the complete list of today's reads, each explained in docs/kernels.md ("Host synchronisation");
a new read anywhere in a compressor or an exchange fails this test until it is justified there.
(Reads inside the compiled ops are not Python-visible: docs/kernels.md lists those too.)"""

import collections

import pytest
from launch import horovodrun, saved_ranks

BUDGET = {  # per tensor and step: {(read, "file:function"): count}
    "RandomBlock": {},
    "RandomK": {},
    "TopK_allgather": {},  # the op's scale (Horovod's reduced placeholder) is read by the unpack op
    "RTopK_allgather": {},
    "Threshold_allgather": {},
    "Threshold_2bit": {},  # each rank's count: read inside sparse_unpack_segments (C++)
    "DGC_allgather_clipped": {},  # the clipping factor stays on the device
    "DGC_spardl": {
        ("tolist", "torch/exchange.py:spardl_blocks"): 1,  # the blocks' bounds, the alltoall's splits
        ("tolist", "torch/exchange.py:spardl_reduced"): 1,
    },  # what arrived from each rank
    "TopK_spardl": {
        ("tolist", "torch/exchange.py:spardl_blocks"): 1,
        ("tolist", "torch/exchange.py:spardl_reduced"): 1,
    },
}


# Under a GradScaler: its scale, read once per step (after the scale changed, as scaler.update()
# changes it), not once per tensor. Per step: {(read, "file:function"): count}.
PER_STEP = {
    "DGC_loss_scaled": {("item", "torch/loss_scaling.py:scale"): 1},
    "Threshold_loss_scaled": {("item", "torch/loss_scaling.py:scale"): 1},
}


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    return saved_ranks(tmp_path_factory, horovodrun, 2, "torch_host_reads.py", timeout=240)


def _assert_reads(reads, config, budget, per_call):
    """Every rank's reads of `config` are exactly `budget` times the calls it counts per
    (per_call(run): tensors x steps, or steps)."""
    for rank in range(2):
        run = reads[rank][config]
        got = collections.Counter(tuple(read) for read in run["reads"])
        want = {site: count * per_call(run) for site, count in budget.items()}
        assert dict(got) == want, f"rank {rank}, {config}: host reads {dict(got)}, documented {want}"


@pytest.mark.parametrize("config", sorted(BUDGET))
def test_host_reads_stay_within_the_documented_budget(reads, config):
    _assert_reads(reads, config, BUDGET[config], lambda run: run["tensors"] * run["steps"])


@pytest.mark.parametrize("config", sorted(PER_STEP))
def test_the_loss_scale_is_read_once_a_step(reads, config):
    _assert_reads(reads, config, PER_STEP[config], lambda run: run["steps"])
