"""The SparDL exchange and exchange="auto" (PyTorch) on 2, 3 and 4 ranks (one horovodrun -np 4,
the smaller sizes process sets of it), against a plain-torch replay of the N ranks
(tests/simulation.py: each method's selection, then simulation.spardl), plus byte counts:
SparDL's stay O(k) per rank as N grows, allgather's grow with N (measured on 2-4 ranks, and
simulated for 8, 16 and 64)."""

import common
import pytest
import reference
import simulation
import torch
from launch import horovodrun, saved_sizes
from replay import LR, STEPS, replay

from sparsecomm.core import cost, plan, trial
from sparsecomm.core.plan import OBSERVED_STEPS

SLOW = cost.Network(bandwidth=1e7, latency=1e-6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch of 4 ranks: 2 and 3 ranks as process sets of it, then the 4 (common.sizes_of)."""
    return saved_sizes(tmp_path_factory, 4, "torch_spardl.py", (2, 3, 4), "--steps", STEPS, "--lr", LR, timeout=600)


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"np{n}")
def run(runs, request):
    return runs[request.param]


def _auto_exchange(size, numel, k):
    return cost.choose(numel, k, 4, 4, size, SLOW)[0]


CASES = {
    "topk_0.1_spardl": ("topk", 0.1, "spardl", {}),
    "topk_1.0_spardl": ("topk", 1.0, "spardl", {}),
    "threshold_0.1_spardl": ("threshold", 0.1, "spardl", {}),
    "rtopk_0.1_spardl": ("rtopk", 0.1, "spardl", {}),
    "dgc_0.1_spardl": ("dgc", 0.1, "spardl", {"dgc": True}),
    "topk_0.1_no_feedback_spardl": ("topk", 0.1, "spardl", {"error_feedback": False}),
    "topk_0.1_allgather": ("topk", 0.1, "allgather", {}),
}


def _check(ranks, config, history):
    for rank, recorded in enumerate(ranks):
        for step in range(STEPS):
            for name, want in history[step].items():
                got = recorded[config]["params"][step][name].reshape(-1)
                torch.testing.assert_close(
                    got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{config} rank {rank} step {step} {name}: {m}"
                )
                assert torch.equal(got, ranks[0][config]["params"][step][name].reshape(-1)), (config, rank, step)


@pytest.mark.parametrize("config", list(CASES))
def test_every_rank_equals_the_replay(run, config):
    method, ratio, exchange, options = CASES[config]
    history, residuals, _, _ = replay(run, config, method, ratio, exchange, **options)
    _check(run, config, history)
    if options.get("error_feedback", True) and not options.get("dgc"):
        for rank, recorded in enumerate(run):  # global residual collection: each rank's dropped values
            for name, residual in recorded[config]["residuals"].items():
                torch.testing.assert_close(residual, residuals[rank][name], rtol=1e-5, atol=1e-6)


# config -> (simulated method, gradient dtype, dtype values travel in)
SIXTEEN_BIT = {
    "topk_0.1_spardl_bfloat16": ("topk", torch.bfloat16, torch.bfloat16),
    "topk_0.1_spardl_float16": ("topk", torch.float16, torch.float16),
    "threshold_fp16_0.1_spardl": ("threshold_fp16", torch.float32, torch.float16),
}


@pytest.mark.parametrize("config", list(SIXTEEN_BIT))
def test_values_travel_in_16_bits_and_rounding_goes_to_the_owner_residual(run, config):
    """Both phases send (2-byte offset, 16-bit value) rows: 4 bytes a pair. The owner rounds its
    float32 sums once; what rounding takes off is in its residual. Each step's exchanged
    gradient equals the replay's bit for bit on every rank, and so do the final residuals and
    the bytes received."""
    method, grad_dtype, value_dtype = SIXTEEN_BIT[config]
    _, residuals, exchanged, received = replay(run, config, method, 0.1, "spardl", value_dtype=value_dtype)
    names = list(residuals[0])
    for step in range(STEPS):
        for name in names:
            want = exchanged[step][name].to(grad_dtype)
            for rank in range(len(run)):
                assert run[rank][config]["grads"][step][name].dtype == grad_dtype
                assert torch.equal(run[rank][config]["exchanged"][step][name].reshape(-1), want), (rank, step, name)
    for rank, recorded in enumerate(run):
        for name in names:
            torch.testing.assert_close(
                recorded[config]["residuals"][name],
                residuals[rank][name],
                rtol=0,
                atol=0,
                msg=lambda m: f"{config} rank {rank} {name} residual: {m}",
            )
            assert recorded[config]["stats"]["tensors"][name]["received_bytes"] == received[rank][name], (rank, name)


@pytest.mark.parametrize("config", ["topk_0.1_spardl", "threshold_0.1_spardl"])
def test_conservation_total_gradient_is_update_times_n_plus_residuals(run, config):
    """sum of every rank's gradients == N * (sum of the averaged updates) + sum of all residuals."""
    size = len(run)
    initial = {n: p.detach().reshape(-1) for n, p in common.torch_model().named_parameters()}
    for name, start in initial.items():
        grads = sum(r[config]["grads"][step][name].reshape(-1) for r in run for step in range(STEPS))
        applied = (start - run[0][config]["params"][-1][name].reshape(-1)) / LR
        residuals = sum(r[config]["residuals"][name] for r in run)
        torch.testing.assert_close(applied * size + residuals, grads, rtol=1e-4, atol=1e-5)


def test_ratio_one_spardl_equals_dense(run):
    tol = dict(rtol=0, atol=0) if len(run) == 2 else dict(rtol=1e-6, atol=1e-7)  # 3+ ranks: Gloo's sum order
    for step in range(STEPS):
        for name, dense in run[0]["dense"]["params"][step].items():
            torch.testing.assert_close(run[0]["topk_1.0_spardl"]["params"][step][name], dense, **tol)


def test_bytes_per_rank_stay_order_k_with_spardl_and_grow_with_allgather(run):
    size = len(run)
    lines = []
    for name, per in run[0]["topk_0.1_spardl"]["stats"]["tensors"].items():
        k = reference.count(0.1, per["numel"])
        spardl = max(r["topk_0.1_spardl"]["stats"]["tensors"][name]["received_bytes"] for r in run) / STEPS
        allgather = run[0]["topk_0.1_allgather"]["stats"]["tensors"][name]["received_bytes"] / STEPS
        assert per["numel"] < 65_535  # one bucket
        send = 6 * (k + 1)  # one rank's allgather send: k rows and the bucket's marker
        lines.append(
            f"N={size} {name:9s} k={k:4d}: received per rank per step: spardl {spardl:7.0f} B "
            f"({spardl / send:.2f} sends), allgather {allgather:7.0f} B ({allgather / send:.2f} sends)"
        )
        assert spardl <= 2 * (size - 1) * 6 * (-(-k // size) + 1)  # at most ceil(k/N) pairs from each rank, twice
        assert allgather == (size - 1) * send
    print("\n" + "\n".join(lines))


def test_auto_goes_dense_where_sparse_costs_more(run):
    """By construction: on FAST (packing costs more than the bytes saved) every tensor goes dense
    and training equals dense; on SLOW each tensor gets the exchange the model predicts."""
    size = len(run)
    fast = run[0]["topk_0.1_auto_fast"]
    assert {t["exchange"] for t in fast["stats"]["tensors"].values()} == {"dense"}
    tol = dict(rtol=0, atol=0) if size == 2 else dict(rtol=1e-6, atol=1e-7)  # 3+ ranks: Gloo's sum order varies
    for step in range(STEPS):
        for name, dense in run[0]["dense"]["params"][step].items():
            torch.testing.assert_close(fast["params"][step][name], dense, **tol)
    slow = run[0]["topk_0.1_auto_slow"]["stats"]["tensors"]
    for per in slow.values():
        assert per["exchange"] == _auto_exchange(size, per["numel"], reference.count(0.1, per["numel"]))
        assert set(per["predicted_seconds"]) == {"dense", "allgather", "spardl"}
    if size >= 3:  # spardl receives less than allgather from 3 ranks on
        assert slow["0.weight"]["exchange"] == "spardl"


def test_measured_auto_sends_by_allgather_while_it_watches_the_backward_then_every_rank_chooses_alike(run):
    """exchange="auto" measuring the cluster itself: it watches OBSERVED_STEPS steps of the backward
    sending by allgather (training equals exchange="allgather"'s bit for bit), then measures once,
    and every rank makes the same choice per tensor from the same averaged windows, timings and
    watched step: at its last step here (the trial's, after the measuring step and one step of
    SparDL where it is tried) the model's choice at the recorded hidden time where it routes by
    the model, else the trial's side."""
    measured = [rank["topk_0.1_auto_measured"] for rank in run]
    for step in range(OBSERVED_STEPS):
        for name, want in run[0]["topk_0.1_allgather"]["params"][step].items():
            assert torch.equal(measured[0]["params"][step][name], want), (step, name)
    keys = ("exchange", "hidden_seconds", "predicted_seconds", "route_trial")
    chosen = [
        {name: tuple(per[key] for key in keys) for name, per in rank["stats"]["tensors"].items()} for rank in measured
    ]
    assert all(each == chosen[0] for each in chosen[1:])
    for exchange, hidden, predicted, side in chosen[0].values():
        sparse = min(("allgather", "spardl"), key=predicted.get)
        dense = predicted["dense"] == 0 or predicted[sparse] > cost.SPARSE_AT_MOST * predicted["dense"]
        by_model = "dense" if dense else sparse
        assert hidden >= 0 and exchange == (by_model if side == trial.MODEL else trial.route_of(side))


@pytest.mark.parametrize("size", [2, 4, 8, 16, 64])
def test_simulated_bytes_for_many_ranks(size):
    """The replay's byte count for N ranks each selecting k of 100,000 (random coordinates):
    SparDL's bytes per rank stay near 2 sends while allgather's are N-1 (a send: k rows of 6
    bytes and the tensor's 2 buckets' markers; a block touches at most 2 buckets)."""
    numel, k = 100_000, 1000
    gen = torch.Generator().manual_seed(size)
    selections = []
    for _ in range(size):
        index = torch.randperm(numel, generator=gen)[:k].sort().values
        selections.append((torch.randn(k, generator=gen), index))
    _, received = simulation.spardl(selections, [torch.zeros(numel) for _ in range(size)], k, numel)
    send = 6 * (k + 2)
    allgather = (size - 1) * send
    print(
        f"N={size:2d}: received per rank: spardl max {max(received):6d} B ({max(received) / send:.2f} sends), "
        f"allgather {allgather:7d} B ({allgather / send:.0f} sends)"
    )
    assert max(received) <= 2 * (size - 1) * 6 * (-(-k // size) + 2) and max(received) <= 2.2 * send


def test_the_route_trial_takes_turns_then_every_rank_keeps_the_same_side_and_a_resume_keeps_it(tmp_path):
    """exchange="auto" measuring the cluster itself, its measured inputs then set so that the
    model sends the first layer dense (hidden by a long window) and the rest sparse, with no
    watched step (every side tried): its routes are tried against every tensor by allgather, by
    SparDL and dense (but the model's own way, where the measured cost of packing sends every
    tensor one way). Steps 0-1 are watched (by allgather), step 2 measures (the model's routes),
    step 3 is all SparDL's first (neither counted), then the steps take turns (the model's routes,
    then each of those still in contention), in rounds of trial.TRIAL_TURNS turns, until the
    trial decides (after 1 to trial.TRIAL_ROUNDS rounds); from then on every rank routes alike,
    by the side of the last round of the lowest median turn ratio of step times (averaged over
    the ranks) where it is below 1 - trial.TRIAL_MARGIN, else by the model (the same seconds and
    ratios on every rank).
    A job restarted from a checkpoint routes as decided from its first step: it neither watches,
    measures nor tries again."""
    out = tmp_path / "trial"
    out.mkdir()
    steps = plan.SETTLING_STEPS + 3
    horovodrun(2, "torch_route_trial.py", "--out", out, "--steps", steps, "--resumed", 3)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    first = ranks[0]["choices"]
    for step in range(plan.OBSERVED_STEPS):
        assert first[step]["0.weight"] == {"exchange": "allgather", "watching_backward": True}
    decided_at = next(step for step in range(steps) if "route_trial_seconds" in first[step]["0.weight"])
    by_model = {choice["exchange"] for choice in first[plan.OBSERVED_STEPS].values()}  # the measuring step
    own = trial.every_tensor(by_model.pop()) if len(by_model) == 1 else None
    turn = (trial.MODEL, *(trial.every_tensor(route) for route in ("allgather", "spardl", "dense")))
    turn = tuple(side for side in turn if side != own)
    warming = [trial.MODEL, *(side for side in turn if side == trial.every_tensor("spardl"))]
    counted = decided_at - plan.OBSERVED_STEPS - len(warming)
    sides = [first[step]["0.weight"]["route_trial"] for step in range(2, decided_at)]
    assert sides[: len(warming)] == warming
    rest, rounds = sides[len(warming) :], [turn]
    while rest:  # rounds of TRIAL_TURNS turns, each round's sides among the previous round's
        in_round = list(rounds[-1])
        assert rest[: len(in_round) * trial.TRIAL_TURNS] == in_round * trial.TRIAL_TURNS
        rest = rest[len(in_round) * trial.TRIAL_TURNS :]
        following = rest[: rest.index(trial.MODEL, 1)] if trial.MODEL in rest[1:] else rest
        assert set(following) <= set(in_round)
        rounds.append(tuple(following) if rest else None)
    assert len(rounds) - 1 <= trial.TRIAL_ROUNDS
    for step, side in zip(range(2, decided_at), sides):
        routes = {choice["exchange"] for choice in first[step].values()}
        assert first[step]["0.weight"]["exchange"] == ("dense" if side == trial.MODEL else trial.route_of(side))
        assert side == trial.MODEL or routes == {trial.route_of(side)}
    decided = first[decided_at]["0.weight"]
    seconds, ratios = decided["route_trial_seconds"], decided["route_trial_ratios"]
    assert set(seconds) == set(turn) and all(s > 0 for s in seconds.values()) and set(ratios) == set(turn[1:])
    assert decided["route_trial_steps"] == counted and decided["route_trial_extra_seconds"] >= 0
    beating = [side for side in rounds[-2][1:] if ratios[side] < 1 - trial.TRIAL_MARGIN]  # the last round's
    winner = min(beating, key=ratios.get, default=trial.MODEL)
    assert decided["route_trial"] == winner
    assert decided["exchange"] == ("dense" if winner == trial.MODEL else trial.route_of(winner))
    for step in range(decided_at, steps):
        assert first[step]["0.weight"] == decided
    assert ranks[1]["choices"] == first  # every step's routes, the trial's seconds, ratio and decision
    keys = ("exchange", "predicted_seconds", "hidden_seconds", "route_trial")
    kept = {name: {key: per[key] for key in keys} for name, per in first[-1].items()}
    for rank in ranks:
        assert rank["resumed_measures"] == 0
        for choices in rank["resumed_choices"]:
            assert {name: {key: per[key] for key in keys} for name, per in choices.items()} == kept
    for name, param in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][name], param), name
