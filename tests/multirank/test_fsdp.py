"""sparsecomm.torch.register_fsdp_hook: compressed HSDP under torchrun --nproc_per_node 4 (2
replicas x 2 shards) and 6 (3 x 2), Gloo (tests/workers/fsdp_train.py: every method, the
allgather, SparDL and dense routes and auto, the default policy, DGC's clipping, a model of three
sharded layers with a frozen one, the everyday model (a tied weight, a frozen layer and a branch
some ranks skip on some steps, whose zeros FSDP reduces), gradient accumulation without sync, bf16
parameters reduced in float32 or bf16, SGD momentum; 10 steps). Each run's full
parameters against the single-process simulation of the replicas and shards
(simulated_hsdp.py), the replicas against each other bit for bit, ratio 1 against FSDP's own
HSDP, a checkpoint resumed under the 4-rank run against not stopping, and replicas initialised
apart refused."""

import common
import pytest
import torch
from launch import torchrun
from simulated_hsdp import simulate_hsdp
from simulated_training import assert_history_close

# 10 steps: the everyday branch's 3-step cycle three times over, and a resume from step 4 with
# its 5 steps after (error feedback and momentum carried through the checkpoint).
STEPS, LR, RESUME_AT = 10, 0.5, 4
RANKS = (4, 6)
# The worker's configurations -> simulate_hsdp's settings. The default policy sends dense every
# shard under 1,024 elements and every 1-D one: all but 0.weight's (16 x 64).
DEFAULT_POLICY_DENSE = ("0.bias", "2.weight", "2.bias")
# The everyday model's branch, run by some ranks on some steps (its zeros reduced on the others).
EVERYDAY_FORWARD = lambda model, x, step, rank: model(x, branch=common.uses_branch(step, rank))  # noqa: E731
SIMULATED = {
    "native": {},
    "frozen/native": {},
    "topk_0.1": dict(method="topk", ratio=0.1),
    "topk_1.0": dict(method="topk", ratio=1.0),
    "topk_0.1_spardl": dict(method="topk", ratio=0.1, exchange="spardl"),
    "topk_0.1_sgd_momentum": dict(method="topk", ratio=0.1, sgd_momentum=0.9),
    "topk_0.1_default_policy": dict(method="topk", ratio=0.1, dense_names=DEFAULT_POLICY_DENSE),
    "rtopk_0.1": dict(method="rtopk_0.3", ratio=0.1),
    "threshold_0.1": dict(method="threshold", ratio=0.1),
    "threshold_0.1_2bit": dict(method="threshold_2bit", ratio=0.1),
    "threshold_0.1_spardl": dict(method="threshold", ratio=0.1, exchange="spardl"),
    "dgc_0.1": dict(dgc=0.9, ratio=0.1),
    "dgc_0.1_spardl": dict(dgc=0.9, ratio=0.1, exchange="spardl"),
    "dgc_0.1_clip": dict(dgc=0.9, ratio=0.1, clip_norm=0.2),
    "randomk_0.1": dict(method="randomk", ratio=0.1),
    "random_block_0.1": dict(method="random_block", ratio=0.1),
    "frozen/topk_0.1": dict(method="topk", ratio=0.1),
    "frozen/dgc_0.1_accumulate": dict(dgc=0.9, ratio=0.1, passes=2),
    "frozen/topk_0.1_bf16": dict(method="topk", ratio=0.1, compute_dtype=torch.bfloat16),
    "frozen/topk_0.1_bf16_reduce": dict(
        method="topk", ratio=0.1, compute_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16
    ),
    "everyday/native": dict(forward=EVERYDAY_FORWARD),
    "everyday/topk_0.1": dict(method="topk", ratio=0.1, forward=EVERYDAY_FORWARD),
    "everyday/dgc_0.1": dict(dgc=0.9, ratio=0.1, forward=EVERYDAY_FORWARD),
}
NAMES = sorted(SIMULATED) + ["topk_0.1_auto"]  # (auto's routes follow the link it measures: not simulated)
RESUMED = [name for name in NAMES if not name.endswith("native")]


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}_ranks")
def run(request, tmp_path_factory):
    """(ranks, every rank's results) of one torchrun of the worker."""
    ranks = request.param
    out = tmp_path_factory.mktemp(f"fsdp_{ranks}")
    resume = ["--resume-at", RESUME_AT] if ranks == 4 else []
    torchrun(ranks, "fsdp_train.py", "--out", out, "--steps", STEPS, "--lr", LR, *resume, timeout=600)
    return ranks, [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(ranks)]


def _model(config):
    models = {"frozen": common.torch_frozen_model, "everyday": common.torch_everyday_model}
    return models.get(config.partition("/")[0], common.torch_model)()


# Not bit for bit: FSDP's backward computes the root's 2.weight gradient an ulp apart from the
# plain model's (its unsharded parameter is a view of the all-gather buffer), on native HSDP too.
@pytest.mark.parametrize("config", sorted(SIMULATED))
def test_every_rank_equals_the_simulation_of_the_replicas_and_shards(run, config):
    ranks, results = run
    want = simulate_hsdp(ranks // 2, lambda: _model(config), STEPS, LR, **SIMULATED[config])
    for rank in (0, ranks - 1):  # the first shard of the first replica, the last of the last
        got = results[rank]["history"][config]
        assert_history_close(got, want)


@pytest.mark.parametrize("config", NAMES)
def test_the_replicas_hold_the_same_parameters_bit_for_bit(run, config):
    ranks, results = run
    first = results[0]["history"][config]
    for rank in range(2, ranks, 2):  # each replica's first rank (a replica's ranks gather the same shards)
        for step, (a, b) in enumerate(zip(first, results[rank]["history"][config])):
            for name in a:
                assert torch.equal(a[name], b[name]), f"rank {rank}, step {step}, {name}"


def test_at_ratio_one_it_is_native_hsdp(run):
    """TopK at ratio 1 sends every element: the replicas' average, as FSDP's own all-reduce
    computes it (bit for bit on 2 replicas: a sum of two is the same in either order; on 3 the
    summation order may differ by an ulp)."""
    ranks, results = run
    tolerance = dict(rtol=0, atol=0) if ranks == 4 else dict(rtol=1e-5, atol=1e-6)
    history = results[0]["history"]
    assert_history_close(history["topk_1.0"], history["native"], **tolerance)


@pytest.mark.parametrize("run", [4], indirect=True, ids=["4_ranks"])  # (the run that resumes)
@pytest.mark.parametrize("config", RESUMED)
def test_a_resumed_checkpoint_continues_bit_for_bit(run, config):
    """The steps after the checkpoint, trained by a fresh model that loaded it, against the run that
    saved it and went on (whose save changed nothing: it equals the simulation)."""
    ranks, results = run
    for rank in range(ranks):
        history = results[rank]["history"]
        resumed = history[f"{config}/resumed"]
        assert len(resumed) == STEPS - RESUME_AT - 1
        for step, (a, b) in enumerate(zip(history[config][RESUME_AT + 1 :], resumed), start=RESUME_AT + 1):
            for name in a:
                assert torch.equal(a[name], b[name]), f"rank {rank}, step {step}, {name}"


def test_the_sparse_routes_send_a_fraction_of_the_dense_bytes(run):
    _, results = run
    stats = results[0]["stats"]
    assert stats["topk_0.1"]["sent_bytes"] < 0.2 * stats["topk_1.0"]["sent_bytes"]
    assert stats["topk_0.1_spardl"]["sent_bytes"] < 0.2 * stats["topk_1.0"]["sent_bytes"]


def test_replicas_that_start_apart_are_refused_on_every_rank(run):
    ranks, results = run
    for rank in range(ranks):
        assert "TopK: the replicas hold different values of '0.weight'" in (results[rank]["refused"] or ""), rank


def test_auto_routes_every_shard_alike_on_every_rank(run):
    ranks, results = run
    routes = [
        {n: t["exchange"] for n, t in results[r]["stats"]["topk_0.1_auto"]["tensors"].items()} for r in range(ranks)
    ]
    assert set(routes[0]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert set(routes[0].values()) <= {"dense", "allgather", "spardl"}
    assert all(r == routes[0] for r in routes[2::2]), routes  # each replica's first rank
