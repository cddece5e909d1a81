"""benchmarks.scaling: the projection past this machine is the floor plus core/cost.py's
model summed over the tensors, and the check against measured rows computes its error right.
Pure arithmetic on hand-made and recorded numbers: nothing is timed."""

import json
import math
import os

import pytest
from paths import ROOT

from benchmarks import scaling
from sparsecomm.core import cost
from sparsecomm.core.selection import selected_count

RESULTS = os.path.join(ROOT, "docs", "results", "results.json")
NET = cost.Network(bandwidth=1e8, latency=1e-4)
LOCAL = cost.LocalCost(per_call=2e-4, per_element=1e-9, per_pair=1e-8)


def test_prediction_is_the_floor_plus_each_tensors_cost():
    # "w" goes sparse; "b" is 1-D and "v" has fewer than 1,024 elements: both go dense
    model = [("w", (64, 32)), ("b", (64,)), ("v", (8, 4))]
    ranks, density, floor = 4, 0.01, 37.0
    k = selected_count(density, 2048)
    w = cost.costs(2048, k, 4, 4, ranks, NET, LOCAL)
    b = cost.costs(64, selected_count(density, 64), 4, 4, ranks, NET, LOCAL)["dense"]
    v = cost.costs(32, selected_count(density, 32), 4, 4, ranks, NET, LOCAL)["dense"]
    got = scaling.predict(model, ranks, NET, LOCAL, floor, density)
    for exchange in ("dense", "allgather", "spardl"):
        assert got[exchange] == pytest.approx(floor + 1000 * (w[exchange] + b + v), rel=1e-12)
    assert got["allgather"] != got["dense"] != got["spardl"]  # the sparse tensor did take each exchange


def test_bare_shapes_are_routed_like_named_ones():
    named = scaling.predict([("a", (64, 32)), ("b", (64,))], 8, NET, LOCAL, 0.0)
    assert scaling.predict([(64, 32), (64,)], 8, NET, LOCAL, 0.0) == named


def test_dense_grows_as_the_ring_says_while_spardl_bytes_stay_order_k():
    shapes = scaling.MODELS["comm"]
    numel = sum(math.prod(shape) for _, shape in shapes)
    sparse = [math.prod(shape) for _, shape in shapes if len(shape) > 1]
    k = sum(selected_count(scaling.DENSITY, n) for n in sparse)
    dense_numel = numel - sum(sparse)  # the biases, dense under every exchange
    bandwidth_only = cost.Network(bandwidth=1.25e9, latency=0.0)
    for ranks in scaling.RANKS:
        ring = 2 * (ranks - 1) / ranks
        got = scaling.predicted_bytes(shapes, ranks)
        assert got["dense"] == pytest.approx(ring * numel * 4)
        # rows of 6 bytes: k of them, and a marker row a 65,535-element bucket of each tensor
        markers = sum(-(-n // 65535) for n in sparse)
        assert got["allgather"] == pytest.approx((ranks - 1) * (k + markers) * 6 + ring * dense_numel * 4)
        # SparDL: 2 (N-1) (ceil(k/N) + a block's markers) rows per tensor: under 12 (k + 2N + n/65,535)
        assert got["spardl"] - ring * dense_numel * 4 <= 12 * sum(k + 2 * ranks + n / 65535 for n in sparse)
        step = scaling.predict(shapes, ranks, bandwidth_only, cost.LocalCost(0, 0, 0), 0.0)
        assert step["dense"] == pytest.approx(1000 * ring * numel * 4 / 1.25e9)

    def sparse_bytes(exchange, ranks):
        return scaling.predicted_bytes(shapes, ranks)[exchange] - 2 * (ranks - 1) / ranks * dense_numel * 4

    # from 2 to 1024 ranks: allgather's pairs grow with N, SparDL's at most triple (8k -> about 16k)
    assert sparse_bytes("allgather", 1024) > 1000 * sparse_bytes("allgather", 2)
    assert sparse_bytes("spardl", 1024) < 3 * sparse_bytes("spardl", 2)


def _row(method, step_ms, ranks=2, network="1gbit", network_model=None, model="comm"):
    row = {"model": model, "method": method, "ranks": ranks, "network": network, "step_ms": step_ms}
    if network_model:
        row["network_model"] = network_model
    return row


def test_check_computes_the_error_against_hand_made_records():
    # comm model on 2 ranks, every tensor dense: 6 tensors x 2 (N-1) steps, each latency scaled by
    # the tensor's share of a fusion buffer, and the ring's 2 (N-1)/N = 1 of the 100,700,160-byte
    # gradient. Shared link: each rank gets half of 1 Gbit/s.
    tensor_bytes = [4 * n for n in (1024 * 4096, 4096, 4096 * 4096, 4096, 4096 * 1024, 1024)]
    latency = sum(2 * 5e-5 * min(1.0, b / cost.FUSION_BYTES) for b in tensor_bytes)
    shared_ms = 100 + 1000 * (latency + 100_700_160 / (1.25e8 / 2))
    per_host_ms = 50 + 1000 * (latency + 100_700_160 / 1.25e8)
    records = [
        _row("floor", 100),
        _row("dense", shared_ms / 0.8),
        _row("floor", 50, network_model="per-host"),
        _row("dense", per_host_ms / 2, network_model="per-host"),
        _row("dense", 1.0, network="unshaped"),
        _row("dense", 1.0, ranks=8),
        _row("TopK 1%", 1.0),
    ]
    checked = scaling.check(records, [])
    assert [(r["network_model"], r["floor"]) for r in checked["rows"]] == [
        ("shared", "measured"),
        ("per-host", "measured"),
    ]
    assert [r["predicted_ms"] for r in checked["rows"]] == pytest.approx([shared_ms, per_host_ms])
    assert [r["error"] for r in checked["rows"]] == pytest.approx([-0.2, 1.0])
    summary = checked["summary"]
    assert (summary["count"], summary["below"]) == (2, 1)
    assert summary["median_abs_error"] == pytest.approx(0.6) and summary["max_abs_error"] == pytest.approx(1.0)


def test_check_predicts_hosts_of_several_ranks_with_the_hosts_model():
    """A 2 x 2 layout's rows (network model "per-host, hosts of 2", ranks_per_host 2, as `bench e2e
    --ranks-per-host 2` records them) are checked against predict_hosts on the NIC's full rate with
    their own floor, hierarchical included, named by their layout; a flat 4-rank cell's floor is
    not theirs, and a hierarchical row of one rank a host is not checked."""
    hosts = dict(ranks=4, network_model="per-host, hosts of 2")
    records = [
        _row("floor", 80, **hosts),
        _row("floor", 10, ranks=4, network_model="per-host"),
        _row("DGC 0.1% hierarchical", 1.0, ranks=4, network_model="per-host"),
    ]
    for method in ("dense", "DGC 0.1% allgather", "DGC 0.1% spardl", "DGC 0.1% hierarchical"):
        records.append(_row(method, 100.0, **hosts))
    for r in records:
        r["ranks_per_host"] = 2 if r["network_model"].endswith("hosts of 2") else 1
    rows = scaling.check(records, [])["rows"]
    assert [(r["ranks"], r["exchange"], r["floor_ms"]) for r in rows] == [
        ("2x2", e, 80) for e in ("dense", "allgather", "spardl", "hierarchical")
    ]
    want = scaling.predict_hosts(scaling.MODELS["comm"], 2, 2, cost.Network(bandwidth=1.25e8, latency=5e-5), None, 80)
    assert [r["predicted_ms"] for r in rows] == pytest.approx([want[r["exchange"]] for r in rows])
    # a run added to the record (bench report --add-e2e): its layouts' rows join the check, not its flat ones
    flat = [_row("floor", 50), _row("dense", 120)]
    for r in flat:
        r["ranks_per_host"] = 1
    results = {"e2e": flat, "e2e_added": [{"records": records + [dict(r, step_ms=999) for r in flat]}]}
    checked = scaling.check_with_added_hosts(results, [])
    assert [(r["ranks"], r["measured_ms"]) for r in checked["rows"]] == [(2, 120)] + [("2x2", 100.0)] * 4
    assert checked["summary"]["count"] == 5


def test_without_a_floor_row_the_floor_is_the_fastest_row_and_says_so():
    records = [_row("dense", 900), _row("DGC 0.1% spardl", 300), _row("RandomBlock 1%", 250, network="unshaped")]
    assert scaling.floor_of(records, "comm", 2) == (250, "estimated")
    assert {r["floor"] for r in scaling.check(records, [])["rows"]} == {"estimated"}
    assert scaling.floor_of(records, "compute", 2) == (None, "none")


def _kernel(op, numel, ms, memcpy_ms=1.0, density=0.001):
    return {"op": op, "numel": numel, "density": density, "median_ms": ms, "memcpy_ms": memcpy_ms}


def test_local_cost_from_the_whole_path_rows_then_from_pack_and_unpack():
    # whole path: 2 ms at 1M, 4 ms at 3M -> 1 ns per element, 1 ms per call; the unpack of
    # 3,000 pairs at 3M takes 0.03 ms more than its memcpy -> 10 ns per pair
    rows = [
        _kernel("DGC whole path (1 rank)", 1_000_000, 2.0),
        _kernel("DGC whole path (1 rank)", 3_000_000, 4.0),
        _kernel(scaling.UNPACK_OP, 3_000_000, 1.03),
        _kernel(scaling.UNPACK_OP, 1_000_000, 0.5),
        _kernel(scaling.PACK_OPS["DGC"], 1_000_000, 1.0),
        _kernel(scaling.PACK_OPS["DGC"], 3_000_000, 1.0),
    ]
    local = scaling.local_cost_from_kernels(rows)
    assert (local.per_call, local.per_element, local.per_pair) == pytest.approx((1e-3, 1e-9, 1e-8))
    fallback = scaling.local_cost_from_kernels(rows[2:])  # pack + unpack: 1.5 ms at 1M, 2.03 ms at 3M
    assert fallback.per_element == pytest.approx(0.53e-3 / 2e6)
    assert "no whole-path rows" in scaling.path_timings(rows[2:])[1]
    assert scaling.local_cost_from_kernels(rows, density=0.01) is None


def test_section_on_the_recorded_results_writes_the_figure(tmp_path):
    with open(RESULTS) as f:
        results = json.load(f)
    for model, shapes in scaling.MODELS.items():  # the written-out shapes are the benchmarked models
        recorded = {r["parameters"] for r in results["e2e"] if r["model"] == model}
        assert recorded == {sum(math.prod(shape) for _, shape in shapes)}
    text = scaling.section(results, str(tmp_path))
    assert text.startswith("## Scaling past this machine")
    assert "![scaling](results/scaling.png)" in text and "median of" in text
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    checked = scaling.check(results["e2e"], results["kernels"])
    flat = 2 * 2 * 2 * 3  # models x ranks x networks x methods
    hosts = 2 * 2 * 4  # the comm model on 2 x 2 and 2 x 3 hosts x networks x methods (hierarchical too)
    assert len(checked["rows"]) == flat + hosts
    assert all(
        row[e] > row["floor_ms"]
        for row in scaling.table(results["kernels"], results["e2e"])
        for e in ("dense", "allgather", "spardl")
    )


def test_host_costs_of_one_rank_per_host_are_the_flat_model_and_hierarchical_is_allgather():
    flat = cost.costs(2**20, 1000, 4, 4, 8, NET, LOCAL)
    hosts = cost.host_costs(2**20, 1000, 4, 4, 8, 1, NET, LOCAL)
    for exchange in ("dense", "allgather"):
        assert hosts[exchange] == pytest.approx(flat[exchange], rel=1e-12)
    assert hosts["spardl"] == pytest.approx(flat["spardl"], rel=1e-12)
    assert hosts["hierarchical"] == pytest.approx(
        cost.local_and_wire(2**20, 1000, 4, 4, 8, NET)["allgather"][1] + LOCAL.seconds(2**20, 8000), rel=1e-12
    )


def test_across_hosts_hierarchical_sends_a_hosts_k_where_allgather_sends_every_ranks():
    """Bandwidth only (no latency, a host link of no cost, no local work): a host's NIC receives
    (H-1) R sends of ceil(k/R) pairs under hierarchical and (N-1) of k under the allgather ring;
    SparDL's 2 R (N-R) of ceil(k/N); one host runs all on its own link. A send is 6-byte rows:
    its pairs and a marker row for each 65,535-element bucket of its range (2^20 elements: 17
    buckets; a block of 2^20 / 8: 3; of 2^20 / 32: 1)."""
    nic, free = cost.Network(bandwidth=1e9, latency=0.0), cost.Network(bandwidth=1e30, latency=0.0)
    none = cost.LocalCost(0, 0, 0)
    hosts, per_host, k = 4, 8, 1000
    got = cost.host_costs(2**20, k, 4, 4, hosts, per_host, nic, none, host_link=free)
    assert got["hierarchical"] == pytest.approx((hosts - 1) * per_host * (math.ceil(k / per_host) + 3) * 6 / 1e9)
    assert got["allgather"] == pytest.approx((32 - 1) * (k + 17) * 6 / 1e9)
    assert got["spardl"] == pytest.approx(2 * per_host * (32 - per_host) * (math.ceil(k / 32) + 1) * 6 / 1e9)
    one = cost.host_costs(2**20, k, 4, 4, 1, per_host, nic, none, host_link=free)
    assert max(one.values()) == pytest.approx(0.0, abs=1e-12)


def test_the_hosts_view_says_at_which_gpu_counts_each_exchange_beats_dense():
    rows = [
        {"model": "m", "network": "n", "ranks": ranks, "dense": 10.0, "allgather": a, "spardl": s, "hierarchical": h}
        for ranks, a, s, h in [(8, 9, 11, 9), (16, 9, 9, 9), (32, 11, 9, 9), (64, 9, 11, 9)]
    ]
    table = scaling.beats_dense_markdown(rows)
    assert table.splitlines()[-1] == "| m | n | 8-16, 64 | 16-32 | 8-64 |"
    for r in rows:
        r["hierarchical"] = 10.0  # a tie is no win
    assert scaling.beats_dense_markdown(rows).splitlines()[-1].endswith("| - |")


def test_the_hosts_view_on_the_recorded_results():
    with open(RESULTS) as f:
        results = json.load(f)
    text = scaling.hosts_section(results["kernels"], results["e2e"])
    assert text.startswith("### Hosts of 8 GPUs") and "| comm | 1 Gbit/s |" in text and "at 1,024 GPUs" in text
    rows = scaling.hosts_table(results["kernels"], results["e2e"])
    assert {r["ranks"] for r in rows} == set(scaling.HOST_RANKS)
    big = next(r for r in rows if (r["model"], r["network"], r["ranks"]) == ("comm", "1 Gbit/s", 1024))
    assert big["hierarchical"] < big["allgather"]  # a host's k, not every rank's, on each NIC
