"""sparsecomm.torch.ddp_hook in DistributedDataParallel under torchrun --nproc_per_node 2 and 3
(Gloo), every compressor (tests/workers/ddp_train.py, 37 configurations on the MLP: shared,
gathered (values, 1- and 2-bit codes) and SparDL routes, the dense route and the per-layer
policy, DGC's warm-up, clipping and masking, a bucket per parameter, gradient_as_bucket_view,
static_graph, a process group of its own, no_sync() accumulation, DDP's own allreduce; and 9 on
the everyday model with find_unused_parameters=True): each rank against the single-process
simulation of the N ranks (simulated_training.py), the ranks against each other bit for bit,
and the hook's stats."""

import common
import pytest
import torch
from launch import ranks_fixture, torchrun
from simulated_training import (
    LR,
    STEPS,
    assert_history_close,
    assert_ranks_close,
    simulate,
    simulate_dgc,
    simulated,
)

# The worker's configurations -> the simulation's (simulated_training.SIMULATIONS), or its
# settings: no_sync() accumulates 2 backward passes a step, as the simulation's `passes`.
SIMULATED_AS = {
    "topk_0.1_buckets": "topk_0.1",
    "topk_0.1_bucket_view": "topk_0.1",
    "topk_0.1_static_graph": "topk_0.1",
    "topk_0.1_group": "topk_0.1",
    "topk_0.1_spardl_static_graph": dict(method="topk", ratio=0.1, exchange="spardl"),
    "topk_0.1_no_sync": dict(method="topk", ratio=0.1, passes=2),
    "dgc_0.1_no_sync": dict(dgc=dict(ratio=0.1, passes=2)),
    "topk_0.1_spardl": dict(method="topk", ratio=0.1, exchange="spardl"),
    "topk_0.1_spardl_buckets": dict(method="topk", ratio=0.1, exchange="spardl"),
    "topk_1.0_spardl": dict(method="topk", ratio=1.0, exchange="spardl"),
    "threshold_0.1_spardl": dict(method="threshold", ratio=0.1, exchange="spardl"),
    "rtopk_0.1_spardl": dict(method="rtopk_0.3", ratio=0.1, exchange="spardl"),
    "dgc_0.1_spardl": dict(dgc=dict(ratio=0.1, exchange="spardl")),
}
CONFIGS = [  # (and topk_0.1_auto, whose routes the network measured decides: its own test)
    "dense",
    "dense_momentum",
    "random_block_0.1",
    "random_block_0.1_momentum",
    "random_block_1.0",
    "randomk_0.1",
    "randomk_1.0",
    "topk_0.1",
    "topk_0.1_buckets",
    "topk_0.1_bucket_view",
    "topk_0.1_static_graph",
    "topk_0.1_spardl_static_graph",
    "topk_0.1_group",
    "topk_0.1_no_sync",
    "dgc_0.1_no_sync",
    "topk_1.0",
    "topk_0.1_no_feedback",
    "topk_0.1_default_policy",
    "rtopk_0.1",
    "rtopk_1.0",
    "threshold_0.1",
    "threshold_0.1_fp16",
    "threshold_1.0",
    "threshold_0.1_1bit",
    "threshold_0.1_2bit",
    "topk_0.1_spardl",
    "topk_0.1_spardl_buckets",
    "topk_1.0_spardl",
    "threshold_0.1_spardl",
    "rtopk_0.1_spardl",
    "dgc_0.1_spardl",
    "dgc_0.1",
    "dgc_0.05_warmup_clip",
    "dgc_1.0_no_masking",
    "dgc_0.1_default_policy",
    "dgc_0.1_default_policy_clip",
    "dgc_0.5_warmup_dense_stage",
    "dgc_0.1_nesterov",
]
# The simulation clips with its own arithmetic (simulation.dgc): an ulp apart from the kernel's.
CLIPPED = {"dgc_0.05_warmup_clip", "dgc_0.1_default_policy_clip"}


# The everyday model (a tied weight, a frozen layer, a branch some ranks skip on some steps, so
# that on steps 2 and 5 no rank uses it) with find_unused_parameters=True.
EVERYDAY = {
    "everyday/topk": dict(method="topk"),
    "everyday/topk_bucket_view": dict(method="topk"),
    "everyday/rtopk": dict(method="rtopk_0.3"),
    "everyday/threshold": dict(method="threshold"),
    "everyday/dgc": None,
    "everyday/dgc_no_sync": dict(passes=2),
    "everyday/randomk": dict(method="randomk"),
    "everyday/random_block": dict(method="random_block"),
    "everyday/topk_spardl": dict(method="topk", exchange="spardl"),
}


run = ranks_fixture(torchrun, "ddp_train.py", "--steps", STEPS, "--lr", LR)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("config", CONFIGS)
def test_every_rank_equals_the_simulation(run, config):
    """On 2 ranks bit for bit; on 3, within a float rounding: Gloo's ring sums the dense payloads
    in its own order, and the unpack scales the sums by 1/3 where the simulation divides by 3."""
    size, ranks = run
    given = SIMULATED_AS.get(config, config)
    want = simulated(size, given) if isinstance(given, str) else simulated(size, **given)
    exact = size == 2 and config not in CLIPPED
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-6, atol=1e-7)
    assert_ranks_close([r["history"][config] for r in ranks], want, **tol)


def test_sparse_training_moved_every_parameter_and_differs_from_dense(run):
    _, ranks = run
    initial = {n: p.detach() for n, p in common.torch_model().named_parameters()}
    dense = ranks[0]["history"]["dense"][-1]
    for config in ("random_block_0.1", "randomk_0.1", "topk_0.1", "rtopk_0.1", "threshold_0.1", "dgc_0.1"):
        last = ranks[0]["history"][config][-1]
        for name, p in initial.items():
            assert not torch.equal(last[name], p), (config, name)
            assert not torch.equal(last[name], dense[name]), (config, name)


def test_the_hook_counts_what_each_parameter_sent_and_received(run):
    """topk_0.1 on the 4 parameters of the MLP (2,048 + 32 + 320 + 10 elements): per parameter
    and step, k rows of 6 bytes and the one bucket's marker row (TopK's capacity is k: no other
    padding), rounded up to whole 8 bytes, and an 8-byte count sent; the other ranks' as much
    received."""
    size, ranks = run
    stats = ranks[0]["stats"]["topk_0.1"]
    k = {"0.weight": 205, "0.bias": 3, "2.weight": 32, "2.bias": 1}
    assert stats["calls"] == STEPS * len(k)
    assert stats["sent_bytes"] == STEPS * sum(8 + -(-6 * (n + 1) // 8) * 8 for n in k.values())
    assert stats["received_bytes"] == (size - 1) * stats["sent_bytes"]
    assert {n: t["exchange"] for n, t in stats["tensors"].items()} == dict.fromkeys(k, "allgather")


def test_auto_measures_over_ddps_group_and_routes_each_tensor(run):
    """exchange="auto" (the default) under the hook: the network measured over torch.distributed,
    each tensor routed dense, by allgather or by SparDL, the same on every rank, and the ranks
    in sync."""
    size, ranks = run
    routes = [{n: t["exchange"] for n, t in r["stats"]["topk_0.1_auto"]["tensors"].items()} for r in ranks]
    assert set(routes[0]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert set(routes[0].values()) <= {"dense", "allgather", "spardl"} and all(r == routes[0] for r in routes)
    for rank in range(1, size):
        assert_history_close(
            ranks[rank]["history"]["topk_0.1_auto"], ranks[0]["history"]["topk_0.1_auto"], rtol=0, atol=0
        )


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("config", list(EVERYDAY))
def test_everyday_model_equals_the_simulation(run, config):
    """Bit for bit on 2 ranks: the tied weight once, the frozen layer untouched, and the branch's
    gradient exchanged on the steps no rank ran it (DDP would leave it None: the hook sets it,
    so what its residual sent is applied, as under Horovod)."""
    size, ranks = run
    forward = lambda model, x, step, rank: model(x, branch=common.uses_branch(step, rank))  # noqa: E731
    settings = dict(steps=STEPS, lr=LR, make_model=common.torch_everyday_model, forward=forward)
    given = EVERYDAY[config]
    if given is None or "method" not in given:  # DGC (with no_sync(): 2 backward passes a step)
        want = simulate_dgc(size, 0.1, **(given or {}), **settings)
    else:
        want = simulate(size, ratio=0.1, **given, **settings)
    # 3 ranks: the 1/3 rounds an update of the embedding's size (entries near 1, whose float32 ulp is
    # 1.2e-7), and where the step cancels the entry to near 0 that ulp stays whole.
    tol = dict(rtol=0, atol=0) if size == 2 else dict(rtol=1e-6, atol=5e-7)
    assert_ranks_close([r["history"][config] for r in ranks], want, **tol)
    frozen = {n: p for n, p in common.torch_everyday_model().named_parameters() if n.startswith("frozen.")}
    assert all(torch.equal(ranks[0]["history"][config][-1][n], p) for n, p in frozen.items())


def test_everyday_ratio_one_equals_ddps_own_allreduce(run):
    """TopK at ratio 1.0 sends everything: DDP's allreduce, bit for bit on 2 ranks."""
    size, ranks = run
    tol = dict(rtol=0, atol=0) if size == 2 else dict(rtol=1e-6, atol=1e-7)
    assert_history_close(ranks[0]["history"]["everyday/topk_1.0"], ranks[0]["history"]["everyday/dense"], **tol)


def test_spardl_pads_each_owners_share_and_each_owned_sum_to_per_rank(run):
    """topk_0.1_spardl, per parameter and step: phase 1 sends every other owner an 8-byte count
    and per_rank = ceil(k / N) rows of 6 bytes and the block's marker row (every block lies in
    one bucket), rounded up to whole 8 bytes; phase 2 all-gathers as much of the owned sums; a
    rank receives as much from each other rank in both phases. O(k) per rank, whatever N."""
    size, ranks = run
    k = {"0.weight": 205, "0.bias": 3, "2.weight": 32, "2.bias": 1}
    share = {name: 8 + -(-6 * (-(-count // size) + 1) // 8) * 8 for name, count in k.items()}
    for rank in ranks:
        tensors = rank["stats"]["topk_0.1_spardl"]["tensors"]
        assert {n: t["exchange"] for n, t in tensors.items()} == dict.fromkeys(k, "spardl")
        for name, bytes_ in share.items():
            assert tensors[name]["sent_bytes"] == STEPS * size * bytes_, name
            assert tensors[name]["received_bytes"] == STEPS * 2 * (size - 1) * bytes_, name
