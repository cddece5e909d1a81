"""docs/ddp.md's recipes inside training frameworks, under torchrun --nproc_per_node 2 (Gloo, CPU;
tests/workers/framework_recipes.py), one launch per framework: PyTorch Lightning (a Callback
registers sparsecomm's hook on the DDP its strategy built) and Hugging Face Accelerate (the hook on
the prepared model), each on DDP's own allreduce, TopK 0.1, DGC 0.1 and TopK 1.0. Every rank
against the single-process simulation (simulated_training.py), bit for bit; the hook's calls; and
Lightning's own ddp_comm_hook argument, which does nothing on CPU. The worker itself checks on
every rank that the hook ran and that the ranks' parameters are equal."""

import importlib.util

import pytest
import torch
from launch import saved_ranks, torchrun
from simulated_training import LR, STEPS, assert_ranks_close, simulated

# framework -> the packages any one of which runs its recipe (requirements.txt pins pytorch_lightning)
FRAMEWORKS = {"lightning": ("lightning", "pytorch_lightning"), "accelerate": ("accelerate",)}
CONFIGS = ["dense", "topk_0.1", "dgc_0.1", "topk_1.0"]
COMPRESSED = ["topk_0.1", "dgc_0.1", "topk_1.0"]
PARAMETERS = 4  # the MLP's: 0.weight, 0.bias, 2.weight, 2.bias


def installed(package):
    return importlib.util.find_spec(package) is not None


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """framework -> what each rank saved; one torchrun launch per framework, on first use."""
    runs = {}

    def get(framework):
        if not any(map(installed, FRAMEWORKS[framework])):
            pytest.skip(f"{' or '.join(FRAMEWORKS[framework])} is not installed (requirements.txt installs it)")
        if framework not in runs:
            args = ("--steps", STEPS, "--lr", LR, framework)
            runs[framework] = saved_ranks(tmp_path_factory, torchrun, 2, "framework_recipes.py", *args, timeout=120)
        return runs[framework]

    return get


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_every_rank_equals_the_simulation(launched, framework, config):
    ranks = launched(framework)
    assert_ranks_close([r["history"][config] for r in ranks], simulated(2, config), rtol=0, atol=0)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_ratio_one_is_averaged_sgd_and_ratio_a_tenth_is_not(launched, framework):
    """TopK 1.0 through the framework's DDP equals plain SGD on the ranks' averaged gradients, bit
    for bit; TopK 0.1 moves the parameters elsewhere (the hook, not DDP's allreduce, reduced them)."""
    ranks = launched(framework)
    dense = simulated(2, "dense")
    assert_ranks_close([r["history"]["topk_1.0"] for r in ranks], dense, rtol=0, atol=0)
    for r in ranks:
        assert not torch.equal(r["history"]["topk_0.1"][-1]["0.weight"], dense[-1]["0.weight"])


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_the_hook_compressed_every_parameter_at_every_step(launched, framework):
    for rank in launched(framework):
        for config in COMPRESSED:
            stats = rank["stats"][config]
            assert stats["calls"] == STEPS * PARAMETERS, config
            assert {t["exchange"] for t in stats["tensors"].values()} == {"allgather"}, config
        assert rank["stats"]["topk_0.1"]["sent_bytes"] < rank["stats"]["topk_0.1"]["dense_bytes"]


@pytest.mark.usefixtures("one_thread")
def test_lightnings_own_hook_argument_does_nothing_on_cpu(launched):
    """DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...) registers the hook on CUDA devices only:
    on CPU the compressor never runs and the job is plain DDP (docs/ddp.md says so)."""
    ranks = launched("lightning")
    for r in ranks:
        assert r["stats"]["topk_0.1_strategy_args"]["calls"] == 0
    assert_ranks_close([r["history"]["topk_0.1_strategy_args"] for r in ranks], simulated(2, "dense"), rtol=0, atol=0)
