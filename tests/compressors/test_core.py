"""The framework-free core (sparsecomm/core): the rules both frameworks take from it, checked
without torch or TF tensors. The frameworks' own tests check that they follow these rules."""

import math

import pytest

from sparsecomm.core import methods, report
from sparsecomm.core.cost import Network
from sparsecomm.core.plan import Planner, Policy, SparDLLayout, sparse_is_larger
from sparsecomm.core.selection import BAND, candidate_ratio, selected_count

SLOW = Network(bandwidth=1e7, latency=1e-6)
FAST = Network(bandwidth=1e12, latency=0.0, copy_bandwidth=1e8)


def test_policy_is_a_pure_function_of_name_size_and_rank():
    policy = Policy.checked("TopK", min_numel=100, dense_1d=True, dense=("*.embedding.*",))
    assert policy.sends_dense("w", 99, 2) and not policy.sends_dense("w", 100, 2)
    assert policy.sends_dense("bias", 1000, 1)
    assert policy.sends_dense("model.embedding.weight", 10**6, 2)
    assert not Policy(min_numel=0, dense_1d=False).sends_dense("bias", 1000, 1)
    with pytest.raises(ValueError, match="TopK: min_numel should be an integer >= 0, got -1"):
        Policy.checked("TopK", min_numel=-1)
    with pytest.raises(TypeError, match="TopK: dense should be a list of name patterns, got 'w'"):
        Policy.checked("TopK", dense="w")


@pytest.mark.parametrize(
    "method,policy,refused",
    [
        (methods.TopK("TopK", 0.01), {}, True),
        (methods.RandomK("RandomK", 0.01), {}, True),
        (methods.RandomBlock("RandomBlock", 0.01), {}, False),  # no indices: an int64 block start
        (methods.TopK("TopK", 0.01), dict(dense=("big",)), False),  # the policy sends it dense
        (methods.TopK("TopK", 0.7), {}, False),  # the dense fallback, at every density
        (methods.DGC("DGC", 0.3, warmup_steps=4, warmup_stages=1), {}, True),  # dense at stage 0, sparse after
    ],
)
def test_more_elements_than_int32_indices_address_are_refused_where_sent_with_indices(method, policy, refused):
    planner = Planner(method.owner, method, Policy.checked(method.owner, **policy))
    planner.check_indexable("big", 2**31 - 1, 2, 4)  # the limit itself is fine
    if not refused:
        planner.check_indexable("big", 2**31, 2, 4)
        return
    with pytest.raises(ValueError, match=rf"{method.owner}: 'big' has 2147483648 elements, more than 2147483647"):
        planner.check_indexable("big", 2**31, 2, 4)
    assert planner.choices == {}  # nothing recorded for stats()


def test_dense_fallback_is_k_wire_rows_against_the_tensor():
    """A row of a 2-byte offset and the value per element, and one marker row (one bucket)."""
    assert not sparse_is_larger(65, 100, 4) and sparse_is_larger(66, 100, 4)  # 6 (k + 1) bytes vs 400
    assert not sparse_is_larger(48, 100, 2) and sparse_is_larger(49, 100, 2)  # 4 (k + 1) bytes vs 200


@pytest.mark.parametrize(
    "exchange,ranks,network,want",
    [
        ("allgather", 4, None, "allgather"),
        ("spardl", 4, None, "spardl"),
        ("auto", 1, None, "allgather"),  # one rank: nothing to choose, nothing to measure
        ("auto", 4, SLOW, "spardl"),
        ("auto", 4, FAST, "dense"),
    ],
)
def test_routes(exchange, ranks, network, want):
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), exchange, network)
    assert planner.route("w", 25_000_000, 2, 4, 0.001, ranks) == want
    assert planner.route("b", 25_000_000, 1, 4, 0.001, ranks) == "dense"  # the policy first


def test_auto_needs_the_network_and_never_measures_it_itself():
    planner = Planner("TopK", methods.TopK("TopK", 0.01), Policy(), "auto", None)
    assert planner.needs_network(4) and not planner.needs_network(1)
    with pytest.raises(RuntimeError, match="measure it first"):
        planner.route("w", 10**6, 2, 4, 0.01, 4)
    assert not Planner("TopK", methods.TopK("TopK", 0.01), Policy(), "auto", SLOW).needs_network(4)
    shared = Planner("RandomK", methods.RandomK("RandomK", 0.01), Policy())
    assert not shared.needs_network(4) and shared.route("w", 10**6, 2, 4, 0.01, 4) == "shared"


def test_a_new_world_measures_the_network_again_but_keeps_a_given_one():
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    planner.use_measurement(SLOW, None)
    assert planner.route("w", 25_000_000, 2, 4, 0.001, 4) == "spardl"
    planner.forget_measurement()  # elastic Horovod: the ranks changed
    assert planner.auto.network is None and planner.needs_network(3)
    planner.use_measurement(FAST, None)
    assert planner.route("w", 25_000_000, 2, 4, 0.001, 3) == "dense"  # chosen again, not the cached route
    given = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", SLOW)
    given.forget_measurement()
    assert given.network is SLOW and not given.needs_network(3)


def test_the_auto_choice_is_recorded_for_stats_and_recomputed_when_k_changes():
    planner = Planner("DGC", methods.DGC("DGC", 0.001), Policy(), "auto", SLOW, dense_fallback=False)
    assert planner.route("w", 10**6, 2, 4, 0.6, 4) == "dense"  # a warm-up density: the pairs cost more
    assert planner.choices["w"]["exchange"] == "dense"
    assert planner.route("w", 10**6, 2, 4, 0.001, 4) == "spardl"
    assert set(planner.choices["w"]["predicted_seconds"]) == {"dense", "allgather", "spardl"}
    assert planner.route("w", 10**6, 2, 4, 0.6, 4, record=False) == "dense"
    assert planner.choices["w"]["exchange"] == "spardl"  # a route asked without recording leaves stats alone


def test_quantized_codes_never_take_spardl():
    method = methods.Threshold("Threshold", 0.001, quantize="1bit")
    assert method.exchanges() == ("dense", "allgather") and method.value_bytes(4) == 1 / 8
    assert methods.Threshold("Threshold", 0.01, quantize="bf16").value_dtype == "bfloat16"
    with pytest.raises(ValueError, match="exchange='spardl' adds values on the way and cannot carry 2bit"):
        methods.Threshold("Threshold", 0.01, quantize="2bit", exchange="spardl")
    with pytest.raises(ValueError, match="exchange='hierarchical' adds values on the way and cannot carry 1bit"):
        methods.Threshold("Threshold", 0.01, quantize="1bit", exchange="hierarchical")


def test_dgc_schedule_is_the_papers_and_its_stage_works_on_any_minimum():
    dgc = methods.DGC("DGC", 0.001, warmup_steps=400, warmup_stages=4)
    assert [round(d, 6) for d in dgc.densities()] == [0.251189, 0.063096, 0.015849, 0.003981, 0.001]
    assert [dgc.stage(s) for s in (0, 99, 100, 399, 400, 10**9)] == [0, 0, 1, 3, 4, 4]
    assert dgc.density(10**9) == 0.001 and dgc.density(0) == dgc.densities()[0]
    calls = []
    dgc.stage(7, minimum=lambda a, b: calls.append((a, b)) or min(a, b))  # TF passes tf.minimum
    assert calls == [(0, 4)]
    assert methods.DGC("DGC", 0.01).densities() == [0.01] and methods.DGC("DGC", 0.01).stage(5) == 0
    assert dgc.counts_dense_steps and dgc.keeps_momentum and not methods.TopK("TopK", 0.1).counts_dense_steps


def test_selection_constants():
    assert selected_count(0.001, 0) == 0 and selected_count(0.001, 10) == 1 and selected_count(1.0, 7) == 7
    # h = 256 sampled hits at the exact k-th (sample_count's minimum): 1 + 6/16 of k, plus 32
    assert candidate_ratio(1000, 10**6) == (1.375 * 1000 + 32) / 10**6 and candidate_ratio(10, 20) == 1.0
    # 1% of 25.6M: a 1% sample holds h = 2,556 hits, so the margin shrinks to 6/sqrt(h)
    n = 25_557_032
    k = selected_count(0.01, n)
    assert candidate_ratio(k, n) == ((1 + 6 / math.sqrt(k / n * 255_571)) * k + 32) / n
    assert candidate_ratio(3, 10**6, sample_ratio=0.0) == (1.5 * 3 + 32) / 10**6  # never above 1.5 k
    assert candidate_ratio(0, 100) == 32 / 100 and candidate_ratio(0, 0) == 1.0
    assert BAND == (0.8, 1.3)


def test_spardl_layout_splits_the_tensor_into_one_block_per_rank():
    layout = SparDLLayout.of(numel=10, k=5, ranks=3)
    assert (layout.block, layout.per_rank) == (4, 2)
    assert layout.bounds() == [0, 4, 8, 12]
    assert [layout.owned(r) for r in range(3)] == [(0, 4), (4, 4), (8, 2)]
    assert SparDLLayout.of(2**31 + 10, 100, 2).bounds()[-1] == 2**31 - 1  # int32-safe


def test_tensor_stats_density():
    stats = report.tensor_stats(
        {"calls": 2, "sent_elements": 10, "dense_bytes": 0, "sent_bytes": 0, "received_bytes": 0},
        100,
        {"exchange": "allgather"},
    )
    assert math.isclose(stats["density"], 0.05) and stats["exchange"] == "allgather" and stats["numel"] == 100
    assert report.tensor_stats(dict.fromkeys(report.COUNTERS, 0), 100, None)["density"] == 1.0


def test_rtopk_draws_with_each_ranks_own_seed():
    """rTop-k's draw is each rank's own: rank 0 keeps the seed, every rank's differs, the
    uint64 wraps; RandomK and RandomBlock keep one seed for all (they have no seed_of)."""
    method = methods.RTopK("RTopK", 0.1, seed=7)
    assert method.seed_of(0) == 7
    seeds = [method.seed_of(rank) for rank in range(1024)]
    assert len(set(seeds)) == 1024 and all(0 <= s < 2**64 for s in seeds)
    assert methods.RTopK("RTopK", 0.1, seed=2**64 - 1).seed_of(1) == 0x9E3779B97F4A7C14
    assert not hasattr(methods.RandomK("RandomK", 0.1, seed=7), "seed_of")
