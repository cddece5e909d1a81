"""The exchange cost model of exchange="auto" (sparsecomm/cost.py), and its argument checks
in both frameworks."""

import math

import pytest

from sparsecomm import Network
from sparsecomm.core import cost

GBIT = Network(bandwidth=1.25e8, latency=5e-5, copy_bandwidth=1e10)
# A million-element float32 tensor, k = 1000 on 4 ranks, in wire rows (sparsecomm.core.wire): a
# 2-byte offset and the value a pair, and a marker row a bucket of 65,535 elements: 16 buckets in
# the tensor, 4 in each SparDL block of 250,000.
GATHERED = (1000 + 16) * 6
SCATTERED = (250 + 4) * 6


def test_the_model_is_the_documented_formula():
    numel, k, ranks = 1_000_000, 1000, 4
    got = cost.costs(numel, k, 4, 4, ranks, GBIT)
    local = 4 * numel * 4 / 1e10
    fused = numel * 4 / cost.FUSION_BYTES  # a 4 MB tensor pays its share of a fused allreduce's latency
    assert got["dense"] == pytest.approx(2 * 3 * 5e-5 * fused + 2 * 3 / 4 * numel * 4 / 1.25e8)
    assert got["allgather"] == pytest.approx(local + 3 * 5e-5 + 3 * GATHERED / 1.25e8)
    assert got["spardl"] == pytest.approx(local + 2 * 3 * 5e-5 + 2 * 3 * SCATTERED / 1.25e8)


@pytest.mark.parametrize(
    "ranks,numel,k,network,want",
    [
        (4, 25_000_000, 25_000, GBIT, "spardl"),  # a large tensor on a slow network, several ranks
        (2, 25_000_000, 25_000, GBIT, "allgather"),  # two ranks: the same bytes, allgather comes first
        (64, 1_000_000, 10_000, GBIT, "spardl"),  # allgather's bytes grow with N
        (4, 100_000, 50_000, GBIT, "dense"),  # half the tensor: the pairs cost more than dense
        (4, 1000, 10, GBIT, "dense"),  # small: Horovod fuses it with the others, a gather pays its own latency
        (4, 25_000_000, 25_000, Network(bandwidth=1e12, latency=5e-6, copy_bandwidth=1e10), "dense"),  # fast network
    ],
)
def test_choices(ranks, numel, k, network, want):
    assert cost.choose(numel, k, 4, 4, ranks, network)[0] == want


def test_pairs_cost_their_value_bytes_plus_a_2_byte_offset_in_both_sparse_exchanges():
    """16-bit values: 4-byte rows in allgather and in SparDL alike (SparDL no longer widens to
    float32); 1-bit codes travel in segments of 2-byte offsets and a 2-byte count a bucket."""
    numel, k, ranks = 1_000_000, 1000, 4
    for value_size in (4, 2):
        got = cost.costs(numel, k, value_size, value_size, ranks, GBIT)
        local = 4 * numel * value_size / 1e10
        assert got["allgather"] == pytest.approx(local + 3 * 5e-5 + 3 * (k + 16) * (value_size + 2) / 1.25e8)
        scattered = 2 * 3 * (math.ceil(k / 4) + 4) * (value_size + 2)
        assert got["spardl"] == pytest.approx(local + 2 * 3 * 5e-5 + scattered / 1.25e8)
        assert cost.received_bytes("spardl", numel, k, value_size, value_size, ranks) == scattered
    assert cost.received_bytes("allgather", numel, k, 4, 1 / 8, ranks) == 3 * (k * (2 + 1 / 8) + 2 * 16)


@pytest.mark.parametrize("sparse_share,want", [(0.79, "allgather"), (0.81, "dense"), (1.2, "dense")])
def test_a_sparse_exchange_must_be_predicted_20_percent_faster_than_dense(sparse_share, want):
    """The model's error is larger than a few percent; dense (exact) takes the near-ties. The local
    per-call cost sets allgather's prediction to sparse_share of dense's."""
    numel, k = 1_000_000, 1000
    dense = cost.costs(numel, k, 4, 4, 2, GBIT)["dense"]
    gather_wire = cost.costs(numel, k, 4, 4, 2, GBIT, cost.LocalCost(0.0, 0.0, 0.0))["allgather"]
    local = cost.LocalCost(sparse_share * dense - gather_wire, 0.0, 0.0)
    choice, predicted = cost.choose(numel, k, 4, 4, 2, GBIT, local=local)
    assert predicted["allgather"] == pytest.approx(sparse_share * dense)
    assert choice == want


def test_allowed_restricts_the_choice():
    assert cost.choose(25_000_000, 25_000, 4, 0.25, 8, GBIT, allowed=("dense", "allgather"))[0] == "allgather"


@pytest.mark.parametrize(
    "link,want",
    [
        (Network(bandwidth=1e10, latency=1e-5), "hierarchical"),  # a fast link inside a host
        (GBIT, "hierarchical"),  # as slow as the NIC: 2 host sends cross a NIC, not 8 ranks' rows
        (Network(bandwidth=1e7, latency=1e-3), "allgather"),  # slower than the NIC: stay flat
    ],
)
def test_hierarchical_is_predicted_and_may_be_chosen_only_with_hosts(link, want):
    """2 hosts of 4 ranks, 1 Gbit/s NICs, a 1M-element tensor at 0.1%: with cost.Hosts the model
    predicts the hierarchical exchange (the terms of host_costs, which test_scaling.py checks),
    and chooses it unless the link inside a host is the slower one; without Hosts it is never
    predicted; `allowed` can leave it out."""
    numel, k, hosts = 1_000_000, 1000, cost.Hosts(2, 4, link)
    choice, predicted = cost.choose(numel, k, 4, 4, 8, GBIT, hosts=hosts)
    assert choice == want
    assert predicted == pytest.approx(cost.host_costs(numel, k, 4, 4, 2, 4, GBIT, host_link=link))
    assert set(predicted) == {"dense", "allgather", "spardl", "hierarchical"}
    flat_choice, flat = cost.choose(numel, k, 4, 4, 8, GBIT)
    assert "hierarchical" not in flat and flat_choice == "allgather"
    assert cost.choose(numel, k, 4, 4, 8, GBIT, allowed=cost.EXCHANGES, hosts=hosts)[0] == "allgather"
    walls = cost.local_and_wire(numel, k, 4, 4, 8, GBIT, hosts=hosts)
    assert {e: work + wire for e, (work, wire) in walls.items()} == pytest.approx(predicted)


def test_received_bytes_spardl_stays_order_k_allgather_grows():
    for ranks in (2, 8, 64):
        assert cost.received_bytes("spardl", 10**6, 1000, 4, 4, ranks) <= 2.2 * 8 * 1000
        assert cost.received_bytes("allgather", 10**6, 1000, 4, 4, ranks) == (ranks - 1) * GATHERED


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(bandwidth=0, latency=1e-5), r"Network: bandwidth should be a finite number > 0 \(latency >= 0\), got 0"),
        (dict(bandwidth=1e9, latency=-1), r"Network: latency should be a finite number > 0 \(latency >= 0\), got -1"),
        (dict(bandwidth=float("inf"), latency=0), r"Network: bandwidth should be a finite number"),
        (dict(bandwidth=1e9, latency=0, copy_bandwidth="fast"), r"Network: copy_bandwidth should be a finite number"),
    ],
)
def test_bad_networks_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Network(**kwargs)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_bad_exchange_settings_are_named(framework):
    family = pytest.importorskip(f"sparsecomm.{framework}")
    choices = "'auto', 'allgather', 'spardl', 'hierarchical'"
    with pytest.raises(ValueError, match=rf"TopK: exchange should be one of {choices}, got 'ring'"):
        family.TopK(ratio=0.1, exchange="ring")
    with pytest.raises(TypeError, match=r"DGC: network should be None \(measured\) or a sparsecomm.Network, got str"):
        family.DGC(network="fast")
    with pytest.raises(ValueError, match=r"Threshold: exchange='spardl' adds values on the way and cannot carry 1bit"):
        family.Threshold(quantize="1bit", exchange="spardl")
    assert "exchange='auto'" in family.TopK(ratio=0.1).settings()
    assert "network=Network(bandwidth=" in family.TopK(ratio=0.1, network=GBIT).settings()


LOCAL = cost.LocalCost(per_call=1e-4, per_element=2e-9, per_pair=5e-9)


def test_a_measured_local_cost_replaces_the_copy_estimate():
    numel, k, ranks = 1_000_000, 1000, 4
    got = cost.costs(numel, k, 4, 4, ranks, GBIT, LOCAL)
    assert got["dense"] == cost.costs(numel, k, 4, 4, ranks, GBIT)["dense"]  # dense has no local work
    gathered = 1e-4 + 2e-9 * numel + 5e-9 * 3 * k  # the other 3 ranks' k pairs are unpacked too
    reduced = 1e-4 + 2e-9 * numel + 5e-9 * 2 * 3 * math.ceil(k / 4)
    assert got["allgather"] == pytest.approx(gathered + 3 * 5e-5 + 3 * GATHERED / 1.25e8)
    assert got["spardl"] == pytest.approx(reduced + 2 * 3 * 5e-5 + 2 * 3 * SCATTERED / 1.25e8)


def test_local_cost_is_fitted_from_two_sizes_and_the_unpack():
    fitted = cost.LocalCost.fitted((1000, 3e-6), (11000, 23e-6), unpack=9e-6, memset=4e-6, pairs=1000)
    assert fitted.per_element == pytest.approx(2e-9) and fitted.per_call == pytest.approx(1e-6)
    assert fitted.per_pair == pytest.approx(5e-9)
    noisy = cost.LocalCost.fitted((1000, 5e-6), (11000, 4e-6), unpack=3e-6, memset=4e-6, pairs=0)
    assert noisy.per_element == 0 and noisy.per_pair == 0 and noisy.per_call == 5e-6  # never below zero


@pytest.mark.parametrize(
    "per_element,want",
    [
        (1e-11, "allgather"),  # packing is nearly free: the 1,000 pairs beat 4 MB on 1 Gbit/s
        (1e-8, "dense"),  # packing costs more than sending the tensor whole: dense, honestly
    ],
)
def test_auto_goes_dense_when_the_measured_sparse_path_costs_more(per_element, want):
    local = cost.LocalCost(per_call=0.0, per_element=per_element, per_pair=0.0)
    fast = Network(bandwidth=1.25e9, latency=5e-6)
    assert cost.choose(1_000_000, 1000, 4, 4, 2, fast, local=local)[0] == want


def test_an_exchange_the_backward_hides_costs_only_its_local_work():
    """A 1M-element tensor on 1 Gbit/s, 2 ranks: dense's wire is 32 ms, allgather's 0.08 ms +
    latency, its local work LOCAL's. Hidden seconds come off each wire time, never the local work."""
    numel, k = 1_000_000, 1000
    (_, dense_wire), (work, gather_wire) = (
        cost.local_and_wire(numel, k, 4, 4, 2, GBIT, LOCAL)[e] for e in ("dense", "allgather")
    )
    assert dense_wire == pytest.approx(2 * 5e-5 * numel * 4 / cost.FUSION_BYTES + numel * 4 / 1.25e8)
    for hidden in (0.0, 0.01, gather_wire / 2, dense_wire, 1.0):
        got = cost.costs(numel, k, 4, 4, 2, GBIT, LOCAL, hidden=hidden)
        assert got["dense"] == pytest.approx(max(0.0, dense_wire - hidden))
        assert got["allgather"] == pytest.approx(work + max(0.0, gather_wire - hidden))
    assert cost.choose(numel, k, 4, 4, 2, GBIT, local=LOCAL)[0] == "allgather"  # nothing hidden: 32 ms to save
    assert cost.choose(numel, k, 4, 4, 2, GBIT, local=LOCAL, hidden=dense_wire - 0.004)[0] == "allgather"
    assert cost.choose(numel, k, 4, 4, 2, GBIT, local=LOCAL, hidden=dense_wire - 0.001)[0] == "dense"  # 1 ms left
    assert cost.choose(numel, k, 4, 4, 2, GBIT, local=LOCAL, hidden=dense_wire)[0] == "dense"  # all hidden: free
    free = cost.LocalCost(0.0, 0.0, 0.0)
    assert cost.choose(numel, k, 4, 4, 2, GBIT, local=free, hidden=1.0)[0] == "dense"  # a tie at 0 goes to dense


def test_hidden_times_serve_the_link_as_one_queue_in_the_order_gradients_are_handed():
    """Windows (seconds from hand-off to the end of the backward) and wire times chosen per tensor;
    the expected values are worked by hand: a's exchange runs from -100 ms to -70 ms, b's from
    -60 to -10 ms, c (ready at -20 ms) waits for b and starts at -10 ms."""
    wire = {"a": 0.03, "b": 0.05, "c": 0.01, "d": 0.02}
    windows = [("c", 0.02), ("a", 0.1), ("b", 0.06)]
    got = cost.hidden_times(windows, lambda name, hidden: wire[name])
    assert got == pytest.approx({"a": 0.1, "b": 0.06, "c": 0.01})
    # d, ready with b (a tie: by name, after b), starts when b is done; a hidden time never goes below 0
    got = cost.hidden_times(windows + [("d", 0.06)], lambda name, hidden: wire[name])
    assert got == pytest.approx({"a": 0.1, "b": 0.06, "d": 0.01, "c": 0.0})
    # what occupies the link is what was chosen at the hidden time the tensor got
    seen = []

    def chosen(name, hidden):
        seen.append((name, hidden))
        return 0.08 if hidden >= 0.08 else 0.001  # dense where hidden, else a short sparse exchange

    got = cost.hidden_times([("a", 0.1), ("b", 0.05)], chosen)
    assert seen == [("a", pytest.approx(0.1)), ("b", pytest.approx(0.02))]
    assert got == pytest.approx({"a": 0.1, "b": 0.02})  # b waits for a's dense exchange until -20 ms
