"""exchange="hierarchical" (PyTorch) on two hosts of 2 and of 3 ranks under horovodrun (this
machine named twice: launch.LAYOUT_HOSTS), against a plain-torch replay of the hosts
(tests/replay.py with simulation.hierarchical): every rank's parameters bitwise equal, and equal
to the replay; each rank's residual holds what it dropped (global residual collection), so the
total gradient is conserved; ratio 1.0 equals dense; torch and TF give the same bits."""

import re

import common
import numpy as np
import pytest
import torch
from launch import LAYOUT_HOSTS, horovodrun, horovodrun_outcome, saved_ranks
from replay import LR, STEPS, replay

from sparsecomm.core import cost
from sparsecomm.core.trial import route_of

# config -> (simulated method, ratio, replay options)
CASES = {
    "topk_0.1_hierarchical": ("topk", 0.1, {}),
    "threshold_0.1_hierarchical": ("threshold", 0.1, {}),
    "rtopk_0.1_hierarchical": ("rtopk", 0.1, {}),
    "dgc_0.1_hierarchical": ("topk", 0.1, {"dgc": True}),
    "topk_0.1_no_feedback_hierarchical": ("topk", 0.1, {"error_feedback": False}),
    "threshold_fp16_0.1_hierarchical": ("threshold_fp16", 0.1, {"value_dtype": torch.float16}),
}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda r: f"2x{r}")
def run(request, tmp_path_factory):
    per_host = request.param
    hosts = ",".join(f"{host}:{per_host}" for host in LAYOUT_HOSTS)
    args = ("--steps", STEPS, "--lr", LR)
    return saved_ranks(tmp_path_factory, horovodrun, 2 * per_host, "torch_hierarchical.py", *args, hosts=hosts)


def test_the_ranks_sit_on_two_hosts(run):
    per_host = len(run) // 2
    for rank, recorded in enumerate(run):
        assert recorded["layout"] == {
            "local_rank": rank % per_host,
            "local_size": per_host,
            "cross_rank": rank // per_host,
        }


@pytest.mark.parametrize("config", list(CASES))
def test_every_rank_equals_the_replay_of_the_hosts(run, config):
    """Parameters after every step: bitwise equal on every rank and to the replay; residuals
    equal to the replay's (what each rank dropped in the host's reduction went to its own)."""
    method, ratio, options = CASES[config]
    assert {t["exchange"] for t in run[0][config]["stats"]["tensors"].values()} == {"hierarchical"}
    history, residuals, _, _ = replay(run, config, method, ratio, "hierarchical", per_host=len(run) // 2, **options)
    for rank, recorded in enumerate(run):
        for step in range(STEPS):
            for name, want in history[step].items():
                got = recorded[config]["params"][step][name].reshape(-1)
                assert torch.equal(got, want), (config, rank, step, name, (got - want).abs().max())
    if options.get("error_feedback", True) and not options.get("dgc"):
        for rank, recorded in enumerate(run):
            for name, residual in recorded[config]["residuals"].items():
                assert torch.equal(residual, residuals[rank][name]), (config, rank, name)


@pytest.mark.parametrize("config", ["topk_0.1_hierarchical", "threshold_0.1_hierarchical"])
def test_conservation_total_gradient_is_update_times_n_plus_residuals(run, config):
    """sum of every rank's gradients == N * (sum of the averaged updates) + sum of all residuals:
    nothing lost, nothing counted twice."""
    initial = {n: p.detach().reshape(-1) for n, p in common.torch_model().named_parameters()}
    for name, start in initial.items():
        grads = sum(r[config]["grads"][step][name].reshape(-1) for r in run for step in range(STEPS))
        applied = (start - run[0][config]["params"][-1][name].reshape(-1)) / LR
        residuals = sum(r[config]["residuals"][name] for r in run)
        torch.testing.assert_close(applied * len(run) + residuals, grads, rtol=1e-4, atol=1e-5)


def test_ratio_one_equals_dense(run):
    """Nothing dropped at ratio 1.0: the hosts' sums of sums equal dense up to float rounding
    (summation order: inside each host, then across hosts)."""
    for step in range(STEPS):
        for name, dense in run[0]["dense"]["params"][step].items():
            torch.testing.assert_close(
                run[0]["topk_1.0_hierarchical"]["params"][step][name], dense, rtol=1e-6, atol=1e-7
            )


def test_auto_measures_the_hosts_and_routes_hierarchical_where_the_model_says(run):
    """exchange="auto" with the hosts' process sets registered: its measurement finds the hosts (2
    of R ranks) and times their link, so the model predicts "hierarchical" beside the flat
    exchanges and each tensor takes the model's choice (the trial's first counted step, after
    one step of each further sparse exchange; a turn's side where the model sends every tensor
    one way and so has one step less to warm); every rank routes alike and
    stays bitwise in sync. With the NIC's measurement replaced by a slow one, the model sends the
    largest tensor hierarchical (a tiny one may go dense: the link's measured latency)."""
    per_host = len(run) // 2
    for config in ("topk_0.1_auto", "topk_0.1_auto_slow_nic"):
        for recorded in run:
            hosts, ranks_a_host, link = recorded["measured_hosts"][config]
            assert (hosts, ranks_a_host) == (2, per_host) and link > 0, config
        keys = ("exchange", "predicted_seconds", "hidden_seconds", "route_trial")
        tensors = [
            {name: {key: per.get(key) for key in keys} for name, per in recorded[config]["stats"]["tensors"].items()}
            for recorded in run
        ]
        assert all(each == tensors[0] for each in tensors[1:]), config
        for name, chosen in tensors[0].items():
            predicted = chosen["predicted_seconds"]
            assert set(predicted) == {"dense", "allgather", "spardl", "hierarchical"}, name
            sparse = min(cost.SPARSE, key=predicted.get)
            dense = predicted["dense"] == 0 or predicted[sparse] > cost.SPARSE_AT_MOST * predicted["dense"]
            side = chosen["route_trial"]  # the model's, or a trial's side where the model sends all one way
            by_model = "dense" if dense else sparse
            assert chosen["exchange"] == (by_model if side == "model" else route_of(side)), name
        for step in range(STEPS):
            for name, want in run[0][config]["params"][step].items():
                assert all(torch.equal(r[config]["params"][step][name], want) for r in run[1:]), (config, step)
    slow = run[0]["topk_0.1_auto_slow_nic"]["stats"]["tensors"]
    largest = max(slow, key=lambda name: slow[name]["numel"])
    predicted = slow[largest]["predicted_seconds"]  # the model's choice (its route, where it routes by the model)
    assert min(cost.SPARSE, key=predicted.get) == "hierarchical"  # a third of allgather's bytes on the slow NIC
    steps = [run[0]["topk_0.1_auto_slow_nic"]["params"][step] for step in (1, 2, 3)]
    assert all(not torch.equal(a[n], b[n]) for a, b in zip(steps, steps[1:]) for n in a)  # it trains


def test_torch_and_tf_give_the_same_bits_on_2_hosts_of_2(tmp_path):
    """tests/workers/cross_framework.py --host-sets (TopK, RTopK, Threshold in float32 and
    bf16 values, DGC with warm-up; tensors of f32, f16, bf16, one with a NaN and +-inf) under
    each framework's hvd.allreduce(..., compression=) on 2 hosts of 2: every step's result and
    the final residual and momentum bitwise equal, NaNs included (the owner's rounding to 16
    bits writes the kernels' quiet NaN in both: exchange.to_value_dtype). TF's exchange="auto"
    measures the hosts and, on a slow NIC, gives exchange="hierarchical"'s bits."""
    hosts = ",".join(f"{host}:2" for host in LAYOUT_HOSTS)
    for framework in ("torch", "tf"):
        horovodrun(4, "cross_framework.py", "--out", tmp_path, "--framework", framework, "--host-sets", hosts=hosts)
    for rank in range(4):
        torch_out, tf_out = (dict(np.load(tmp_path / f"{f}_rank{rank}.npz")) for f in ("torch", "tf"))
        auto = {k: tf_out.pop(k) for k in list(tf_out) if k.startswith("topk_auto_hosts/")}  # TF only
        extra = set(tf_out) - set(torch_out)  # TF creates every residual up front, torch on first use
        assert set(torch_out) <= set(tf_out) and all("/residual/" in k and not tf_out[k].any() for k in extra), extra
        assert list(auto.pop("topk_auto_hosts/hosts")[:2]) == [2, 2]  # auto measured the hosts ...
        for key, value in auto.items():  # ... and, on a slow NIC, routed as exchange="hierarchical" does
            fixed = tf_out[key.replace("topk_auto_hosts/", "topk_hierarchical/")]
            same = (
                str(value) == str(fixed)
                if "/exchange/" in key
                else np.array_equal(value.view(np.int32), fixed.view(np.int32))
            )
            assert same, key
        assert len(torch_out) > 40
        for key, value in torch_out.items():
            if "/exchange/" in key:
                assert str(value) == str(tf_out[key]) == "hierarchical", (rank, key)
                continue
            same = value.view(np.int32) == tf_out[key].view(np.int32)
            assert same.all(), (rank, key, value[~same], tf_out[key][~same])


def test_what_it_cannot_run_is_refused_on_every_rank():
    """Without the hosts' process sets registered (hvd.init()), and with a process set of 2 of
    the 4 ranks: the same error on every rank concerned, naming what to do, and no hang."""
    hosts = ",".join(f"{host}:2" for host in LAYOUT_HOSTS)
    output = horovodrun(4, "torch_hierarchical_refused.py", hosts=hosts, timeout=180)
    errors = re.findall(r"rank \d+: (\w+Error: .*)", output)
    unregistered = [e for e in errors if "host_process_sets()" in e]
    assert len(unregistered) == 4 and len(set(unregistered)) == 1, output[-3000:]
    assert unregistered[0].startswith("RuntimeError: exchange='hierarchical' runs on the process sets of the hosts")
    subset = [e for e in errors if "leave process_set=None" in e]
    assert len(subset) == 2 and "not a process set of 2 of 4 ranks" in subset[0], output[-3000:]
    assert "trained" not in output


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_a_host_done_first_waits_at_exit_for_a_host_still_gathering(framework):
    """Host 1's ranks reach their exit 3 s before host 0's ranks gather inside their host (as a
    host still in the last phase does): they wait (host_sets.end_together), so nothing cuts the
    gather, and every rank exits cleanly."""
    hosts = ",".join(f"{host}:2" for host in LAYOUT_HOSTS)
    args = ("--framework", framework, "--late", 3, "--wait", 60)
    output = horovodrun(4, "hierarchical_end.py", *args, hosts=hosts, timeout=180)
    assert len(re.findall(r"rank [01]: gathered late", output)) == 2, output[-3000:]
    assert len(re.findall(r"rank \d: exits", output)) == 4, output[-3000:]


def test_a_rank_waits_at_exit_only_so_long():
    """Where host 0 comes later than the wait (2 s of a 10 s delay), host 1 exits without it and
    host 0's gather fails as Horovod's collectives do once a rank has exited: an error on ranks 0
    and 1, not a hang."""
    hosts = ",".join(f"{host}:2" for host in LAYOUT_HOSTS)
    args = ("--framework", "torch", "--late", 10, "--wait", 2)
    code, output, _ = horovodrun_outcome(4, "hierarchical_end.py", *args, hosts=hosts, timeout=180)
    assert code != 0 and "gathered late" not in output, output[-3000:]
    assert len(re.findall(r"rank [23]: exits", output)) == 2, output[-3000:]
    # Horovod's error once it has shut down ("Process set provided does not exist" for a host's set)
    assert all(re.search(rf"\[{r}\]<stderr>:\w+Error: ", output) for r in (0, 1)), output[-3000:]
