"""The exchange cost model of exchange="auto" (sparsecomm/cost.py), and its argument checks
in both frameworks."""
import math

import pytest

from sparsecomm import Network
from sparsecomm.core import cost

GBIT = Network(bandwidth=1.25e8, latency=5e-5, copy_bandwidth=1e10)


def test_the_model_is_the_documented_formula():
    numel, k, ranks = 1_000_000, 1000, 4
    got = cost.costs(numel, k, 4, 4, ranks, GBIT)
    local = 4 * numel * 4 / 1e10
    assert got["dense"] == pytest.approx(2 * 3 * 5e-5 + 2 * 3 / 4 * numel * 4 / 1.25e8)
    assert got["allgather"] == pytest.approx(local + 3 * 5e-5 + 3 * k * 8 / 1.25e8)
    assert got["spardl"] == pytest.approx(local + 2 * 3 * 5e-5 + 2 * 3 * math.ceil(k / 4) * 8 / 1.25e8)


@pytest.mark.parametrize("ranks,numel,k,network,want", [
    (4, 25_000_000, 25_000, GBIT, "spardl"),       # a large tensor on a slow network, several ranks
    (2, 25_000_000, 25_000, GBIT, "allgather"),    # two ranks: the same bytes, allgather comes first
    (64, 1_000_000, 10_000, GBIT, "spardl"),       # allgather's bytes grow with N
    (4, 100_000, 50_000, GBIT, "dense"),           # half the tensor: the pairs cost more than dense
    (4, 1000, 10, GBIT, "allgather"),              # latency-bound: one ring pass, where dense takes two
    (4, 25_000_000, 25_000, Network(bandwidth=1e12, latency=5e-6, copy_bandwidth=1e10), "dense"),  # fast network
])
def test_choices(ranks, numel, k, network, want):
    assert cost.choose(numel, k, 4, 4, ranks, network)[0] == want


def test_allowed_restricts_the_choice():
    assert cost.choose(25_000_000, 25_000, 4, 0.25, 8, GBIT, allowed=("dense", "allgather"))[0] == "allgather"


def test_received_bytes_spardl_stays_order_k_allgather_grows():
    for ranks in (2, 8, 64):
        assert cost.received_bytes("spardl", 10**6, 1000, 4, 4, ranks) <= 2.2 * 8 * 1000
        assert cost.received_bytes("allgather", 10**6, 1000, 4, 4, ranks) == (ranks - 1) * 8000


@pytest.mark.parametrize("kwargs,message", [
    (dict(bandwidth=0, latency=1e-5), r"Network: bandwidth should be a finite number > 0 \(latency >= 0\), got 0"),
    (dict(bandwidth=1e9, latency=-1), r"Network: latency should be a finite number > 0 \(latency >= 0\), got -1"),
    (dict(bandwidth=float("inf"), latency=0), r"Network: bandwidth should be a finite number"),
    (dict(bandwidth=1e9, latency=0, copy_bandwidth="fast"), r"Network: copy_bandwidth should be a finite number"),
])
def test_bad_networks_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Network(**kwargs)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_bad_exchange_settings_are_named(framework):
    family = pytest.importorskip(f"sparsecomm.{framework}")
    with pytest.raises(ValueError, match=r"TopK: exchange should be one of 'auto', 'allgather', 'spardl', got 'ring'"):
        family.TopK(ratio=0.1, exchange="ring")
    with pytest.raises(TypeError, match=r"DGC: network should be None \(measured\) or a sparsecomm.Network, got str"):
        family.DGC(network="fast")
    with pytest.raises(ValueError, match=r"Threshold: exchange='spardl' adds values on the way and cannot carry 1bit"):
        family.Threshold(quantize="1bit", exchange="spardl")
    assert "exchange='auto'" in family.TopK(ratio=0.1).settings()
    assert "network=Network(bandwidth=" in family.TopK(ratio=0.1, network=GBIT).settings()
