"""The framework-free core (sparsecomm/core): the rules both frameworks take from it, checked
without torch or TF tensors. The frameworks' own tests check that they follow these rules."""

import math

import pytest

from sparsecomm.core import cost, methods, plan, report
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


def test_backward_windows_run_from_each_hand_off_to_the_last_one_of_the_step():
    from sparsecomm.core.plan import BackwardWindows

    watched = BackwardWindows(steps=2)
    for name, now in (("fc", 10.0), ("conv2", 10.5), ("conv1", 10.75)):
        watched.note_handoff(name, now)
    assert not watched.complete() and watched.windows == {}
    watched.note_decompress()  # Horovod's synchronize, after the backward: the step ends here
    watched.note_decompress()  # the step's other decompresses change nothing
    assert watched.windows == {"fc": 0.75, "conv2": 0.25, "conv1": 0.0} and not watched.complete()
    for name, now in (("fc", 20.0), ("conv2", 20.125), ("conv1", 20.25)):
        watched.note_handoff(name, now)
    watched.note_decompress()
    assert watched.windows == {"fc": 0.25, "conv2": 0.125, "conv1": 0.0} and watched.complete()  # the last step's


def _step(planner, shapes, ended_at, density=0.001, ranks=2):
    """One step as the torch adapter drives the planner: the StepClock ticks at the first compress,
    each tensor is routed, and the step ends (its last decompress) at `ended_at`. Returns the routes."""
    planner.auto.steps.note_compress()
    routes = {name: planner.route(name, numel, 2, 4, density, ranks) for name, numel in shapes.items()}
    planner.auto.steps.note_decompress(ended_at)
    return routes


def _watched(planner, windows, shapes, density=0.001, ranks=2):
    """Two steps of watching: each tensor routed (dense meanwhile) and handed `windows` seconds before
    the end of the backward."""
    planner.auto.watch_backward()
    for step in range(2):
        planner.auto.steps.note_compress()
        for name, numel in shapes.items():
            assert planner.route(name, numel, 2, 4, density, ranks) == "dense"
            assert planner.choices[name] == {"exchange": "dense", "watching_backward": True}
            planner.auto.backward.note_handoff(name, 100.0 - windows[name])
        planner.auto.backward.note_handoff("last", 100.0)  # the first layer's gradient, the end of the backward
        planner.auto.backward.note_decompress()
        planner.auto.steps.note_decompress(float(step))
    assert not planner.watching() and planner.auto.backward.windows == pytest.approx(dict(windows, last=0.0))


GBIT = Network(bandwidth=1.25e8, latency=5e-5, copy_bandwidth=1e10)
EARLY_AND_LATE = {"early": 10**6, "late": 10**6}
ALL_ALLGATHER, ALL_SPARDL = plan.every_tensor("allgather"), plan.every_tensor("spardl")


def test_auto_sends_dense_while_it_watches_the_backward_then_leaves_hidden_exchanges_dense():
    """1 Gbit/s, 2 ranks, 1M-element tensors: dense's wire is 32 ms, allgather's pack costs the
    copy estimate (1.6 ms). `early` is handed 50 ms before the end of the backward: its dense
    exchange is hidden, so it stays dense. `late` is handed 31 ms before the end, but the link
    is busy with `early`'s 32 ms until -18 ms: 14 ms of its dense exchange would stick out, and
    it goes sparse. Alone on the link it would have 31 ms hidden and stay dense. Without the
    windows both would go sparse. The model sends one dense and one sparse, so its routes are
    tried against every tensor by allgather, by SparDL and dense: the measuring step routes all
    by allgather, the next all by SparDL (both uncounted, each a route's first use), the next
    one by the model."""
    dense_wire = cost.local_and_wire(10**6, 1000, 4, 4, 2, GBIT)["dense"][1]
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.05, "late": 0.031}, EARLY_AND_LATE)
    assert planner.needs_network(2)
    planner.use_measurement(GBIT, None, {"early": 0.05, "late": 0.031, "frozen": 0.0})
    assert _step(planner, EARLY_AND_LATE, 2.0) == {"early": "allgather", "late": "allgather"}
    assert planner.auto.trial.alternatives == (ALL_ALLGATHER, ALL_SPARDL, plan.ALL_DENSE)
    assert planner.auto.trial.warming == (ALL_ALLGATHER, ALL_SPARDL)
    assert planner.auto.trial.counted_from == plan.first_counted_step() == 4
    assert planner.choices["early"]["route_trial"] == ALL_ALLGATHER
    assert _step(planner, EARLY_AND_LATE, 2.5) == {"early": "spardl", "late": "spardl"}
    assert _step(planner, EARLY_AND_LATE, 3.0) == {"early": "dense", "late": "allgather"}
    assert planner.choices["early"]["hidden_seconds"] == pytest.approx(0.05)
    assert planner.choices["late"]["hidden_seconds"] == pytest.approx(0.05 - dense_wire)
    assert planner.choices["late"]["route_trial"] == plan.MODEL
    alone = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(alone, {"late": 0.031}, {"late": 10**6})
    alone.use_measurement(GBIT, None, {"late": 0.031})
    assert _step(alone, {"late": 10**6}, 2.0) == {"late": "allgather"}  # the measuring step
    assert _step(alone, {"late": 10**6}, 2.5) == {"late": "spardl"}
    assert _step(alone, {"late": 10**6}, 3.0) == {"late": "dense"}
    assert alone.auto.trial.alternatives == (ALL_ALLGATHER, ALL_SPARDL)  # the model sends nothing sparse
    planner.forget_measurement()  # a new world watches again
    assert planner.auto.trial is None and planner.auto.steps.step == 0
    assert planner.watching() and planner.route("early", 10**6, 2, 4, 0.001, 2) == "dense"
    unwatched = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", GBIT)
    unwatched.auto.watch_backward()  # a network the user gave: nothing measured, nothing watched or tried
    assert not unwatched.watching() and unwatched.route("early", 10**6, 2, 4, 0.001, 2) == "allgather"
    assert "hidden_seconds" not in unwatched.choices["early"] and "route_trial" not in unwatched.choices["early"]
    assert unwatched.auto.steps is None and unwatched.auto.trial is None


def test_final_routes_are_decided_once_and_again_when_the_network_or_the_world_changes():
    """The steady state decides nothing again: once the trial is decided, a route is kept per
    tensor and inputs (a new density or count of ranks decides again). A new world watches again
    (dense meanwhile), and a new network decides again, whatever was kept."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"w": 0.0}, {"w": 10**6})
    planner.use_measurement(GBIT, None, {"w": 0.0})
    decided, decide = [], planner._decide
    planner._decide = lambda *args: decided.append(args[0]) or decide(*args)
    assert planner.auto.trial is None
    trying = 2 + 3 * plan.TRIAL_TURNS  # the measuring step, all SparDL's first, and a round: decided at every step
    for step in range(trying):
        _step(planner, {"w": 10**6}, 3.0 + step)
    assert len(decided) == trying and planner.auto.trial.alternatives == (ALL_SPARDL, plan.ALL_DENSE)
    planner.auto.steps.note_compress()
    planner.auto.add_trial_round([1.0, 2.0, 2.0] * plan.TRIAL_TURNS)  # the model's routes faster in every turn: kept
    decided.clear()
    assert [planner.route("w", 10**6, 2, 4, 0.001, 2) for _ in range(3)] == ["allgather"] * 3
    assert decided == ["w"]  # once, then kept
    assert planner.route("w", 10**6, 2, 4, 0.5, 2) == "dense" and decided == ["w"] * 2  # another density
    assert planner.route("w", 10**6, 2, 4, 0.001, 3) == "allgather" and decided == ["w"] * 3  # other ranks
    assert planner.route("w", 10**6, 2, 4, 0.001, 3) == "allgather" and decided == ["w"] * 3
    planner.forget_measurement()  # a new world of as many ranks: watched again, dense meanwhile
    assert planner.watching() and planner.route("w", 10**6, 2, 4, 0.001, 3) == "dense"
    unwatched = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    unwatched.use_measurement(GBIT, None)
    assert unwatched.route("w", 10**6, 2, 4, 0.001, 2) == "allgather"
    unwatched.use_measurement(FAST, None)  # copies slower than the link: decided again
    assert unwatched.route("w", 10**6, 2, 4, 0.001, 2) == "dense"


def test_auto_routes_hierarchical_where_the_hosts_were_measured():
    """A measurement with cost.Hosts (the hosts' process sets registered: 2 hosts of 4 ranks, a
    10 GB/s link inside a host, 1 Gbit/s NICs) lets auto route "hierarchical" for a method that
    can use SparDL, by the model and as a side of the trial (after all allgather, all SparDL); never
    for 1-bit codes (no SparDL), without Hosts, or where the way in lacks it (the DDP hook); a new
    world forgets the hosts with the network."""
    hosts = cost.Hosts(2, 4, Network(bandwidth=1e10, latency=1e-5))
    shapes = {"early": 10**6, "late": 10**6}
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.5, "late": 0.0}, shapes, ranks=8)  # `early`'s dense exchange is hidden
    planner.use_measurement(GBIT, None, {"early": 0.5, "late": 0.0}, hosts)
    warming = [ALL_ALLGATHER, ALL_SPARDL, plan.every_tensor("hierarchical")]
    assert planner.auto.trial is None and _step(planner, shapes, 2.0, ranks=8) == dict.fromkeys(shapes, "allgather")
    assert planner.auto.trial.warming == tuple(warming) and planner.auto.trial.alternatives[-1] == plan.ALL_DENSE
    assert planner.auto.trial.counted_from == plan.first_counted_step(hosts=True) == 5
    for i, side in enumerate(warming[1:]):
        assert _step(planner, shapes, 2.1 + i, ranks=8) == dict.fromkeys(shapes, plan.route_of(side))
        assert planner.choices["late"]["route_trial"] == side
    assert _step(planner, shapes, 3.0, ranks=8) == {"early": "dense", "late": "hierarchical"}
    assert set(planner.choices["late"]["predicted_seconds"]) == {"dense", "allgather", "spardl", "hierarchical"}
    planner.forget_measurement()
    assert planner.auto.hosts is None
    for method, available, measured_hosts in [
        (methods.Threshold("Threshold", 0.001, quantize="1bit"), None, hosts),
        (methods.TopK("TopK", 0.001), None, None),
        (methods.TopK("TopK", 0.001), ("dense", "allgather"), hosts),
    ]:
        other = Planner(method.owner, method, Policy(), "auto", None)
        if available:
            other.auto.untimed(available)
        other.use_measurement(GBIT, None, None, measured_hosts)
        assert other.route("w", 10**6, 2, 4, 0.001, 8) == "allgather", method.owner


def _trial_planner():
    """A planner after the watch (steps 0, 1) whose model sends `early` dense and `late` by
    allgather: its routes are tried against all allgather, all SparDL and all dense, after the
    measuring step (2, all allgather) and all SparDL's first step (3), not counted."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.05, "late": 0.031}, EARLY_AND_LATE)
    planner.use_measurement(GBIT, None, {"early": 0.05, "late": 0.031})
    return planner


SIDES = (plan.MODEL, ALL_ALLGATHER, ALL_SPARDL, plan.ALL_DENSE)
ROUTES = {
    plan.MODEL: {"early": "dense", "late": "allgather"},
    ALL_ALLGATHER: {"early": "allgather", "late": "allgather"},
    ALL_SPARDL: {"early": "spardl", "late": "spardl"},
    plan.ALL_DENSE: {"early": "dense", "late": "dense"},
}
BY_MODEL = ROUTES[plan.MODEL]
COUNTED_FROM = plan.first_counted_step()  # 4: after the watch (0, 1) and the warming steps (2, 3)


def _warmed(planner):
    """The trial's uncounted steps (2, 3): every tensor by allgather, then by SparDL."""
    for step, side in zip(range(2, COUNTED_FROM), (ALL_ALLGATHER, ALL_SPARDL)):
        assert _step(planner, EARLY_AND_LATE, float(step)) == ROUTES[side]
    return float(COUNTED_FROM - 1)


def _trial_round(planner, ended, seconds):
    """A round of the trial, each step ending `seconds[side][i]` after the previous one (i: the
    turn): checks the turns and the routes of each side, and returns when the last ended."""
    for i in range(len(SIDES) * plan.TRIAL_TURNS):
        side = SIDES[i % len(SIDES)]
        ended += seconds[side][i // len(SIDES)]
        assert _step(planner, EARLY_AND_LATE, ended) == ROUTES[side]
        assert (
            planner.auto.trial.arm(planner.auto.steps.step) == side and planner.choices["early"]["route_trial"] == side
        )
        assert not planner.auto.round_ended()
    planner.auto.steps.note_compress()  # the first compress after the round
    assert planner.auto.round_ended() and planner.timing_steps()
    return ended


@pytest.mark.parametrize("faster", SIDES)
def test_the_route_trial_keeps_the_side_faster_in_every_turn_after_one_round(faster):
    """After the watch (steps 0, 1) and the warming steps (2, 3, not counted), steps 4-19 take
    turns: the model's routes, every tensor by allgather, by SparDL, dense, each timed from the
    previous step's end to its own. The faster side takes 0.3 s, the others 0.4 s, except in
    the first turn, where a slow spell makes all ten times slower (its ratios are the same, and
    the medians ignore it). Every turn agrees, so the trial decides at the first compress of
    step 20, and the faster side routes from then on."""
    planner = _trial_planner()
    seconds = {side: [3.0, 0.3, 0.3, 0.3] if side == faster else [4.0, 0.4, 0.4, 0.4] for side in SIDES}
    _trial_round(planner, _warmed(planner), seconds)
    round_seconds = planner.auto.trial.round_seconds(planner.auto.steps)
    assert round_seconds == pytest.approx([x for turn in zip(*(seconds[side] for side in SIDES)) for x in turn])
    planner.auto.add_trial_round(round_seconds)  # as averaged over the ranks
    assert not planner.auto.round_ended() and not planner.timing_steps()
    decided_at = COUNTED_FROM + len(SIDES) * plan.TRIAL_TURNS
    for step in range(decided_at, decided_at + 3):
        if step > decided_at:
            planner.auto.steps.note_compress()
        routes = {name: planner.route(name, numel, 2, 4, 0.001, 2) for name, numel in EARLY_AND_LATE.items()}
        assert routes == ROUTES[faster]
    shown = planner.choices["early"]
    assert shown["route_trial"] == faster and shown["route_trial_steps"] == len(SIDES) * plan.TRIAL_TURNS
    assert shown["route_trial_seconds"] == pytest.approx({side: 0.3 if side == faster else 0.4 for side in SIDES})
    ratio = {side: 0.75 if side == faster else 1.0 if faster != plan.MODEL else 4 / 3 for side in SIDES[1:]}
    assert shown["route_trial_ratios"] == pytest.approx(ratio)
    kept = planner.auto.steps.ends  # no more than the longest round needs
    assert kept.maxlen == plan.MOST_SIDES * plan.TRIAL_TURNS + 1 and len(kept) == min(kept.maxlen, decided_at)


@pytest.mark.parametrize("agreeing, kept", [(0.90, ALL_ALLGATHER), (1.05, plan.MODEL)])
def test_a_close_route_trial_goes_on_for_its_rounds_then_the_median_pair_decides(agreeing, kept):
    """Turns that disagree (all allgather 10% faster in some, 5% slower in others; all SparDL
    and all dense always 20% slower): the trial goes on, still taking turns, round after round.
    The second round's turns all agree (all allgather's ratio `agreeing`), but the first round's
    do not, so it goes on; after TRIAL_ROUNDS rounds the median turn decides: 8 of the 12
    ratios are `agreeing`."""
    planner = _trial_planner()
    ended = _warmed(planner)
    slow = {plan.MODEL: [1.0] * 4, ALL_SPARDL: [1.2] * 4, plan.ALL_DENSE: [1.2] * 4}
    mixed = dict(slow, **{ALL_ALLGATHER: [0.90, 1.05, 0.90, 1.05]})
    rounds = [mixed, dict(slow, **{ALL_ALLGATHER: [agreeing] * 4}), mixed]
    assert len(rounds) == plan.TRIAL_ROUNDS
    for i, seconds in enumerate(rounds):
        ended = _trial_round(planner, ended, seconds)
        planner.auto.add_trial_round(planner.auto.trial.round_seconds(planner.auto.steps))
        assert planner.auto.trial.rounds == i + 1
        assert (planner.auto.trial.winner is None) == (i + 1 < plan.TRIAL_ROUNDS)
    assert planner.auto.trial.winner == kept and planner.auto.trial.ratio(ALL_ALLGATHER) == pytest.approx(agreeing)
    routes = {name: planner.route(name, numel, 2, 4, 0.001, 2) for name, numel in EARLY_AND_LATE.items()}
    assert routes == ROUTES[kept]
    assert planner.choices["early"]["route_trial_steps"] == len(SIDES) * plan.TRIAL_TURNS * plan.TRIAL_ROUNDS


@pytest.mark.parametrize(
    "model, alternative, kept",
    [
        (1.0, 1.0, plan.MODEL),  # a tie
        (1.0, 0.98, plan.MODEL),  # 2% faster: within TRIAL_MARGIN (3%), the trial cannot tell it apart
        (1.0, 0.971, plan.MODEL),
        (1.0, 0.969, ALL_ALLGATHER),  # faster by more than the margin
        (0.5, 1.0, plan.MODEL),
    ],
)
def test_the_alternative_must_beat_the_model_by_the_trial_margin(model, alternative, kept):
    """Every turn alike: decided after one round, by the margin."""
    trial = plan.RouteTrial(2, (ALL_ALLGATHER,))
    trial.add_round([model, alternative] * plan.TRIAL_TURNS)
    assert trial.winner == kept and trial.arm(20) == kept and trial.rounds == 1
    assert trial.shown(20) == {
        "route_trial": kept,
        "route_trial_seconds": {plan.MODEL: model, ALL_ALLGATHER: alternative},
        "route_trial_ratios": {ALL_ALLGATHER: pytest.approx(alternative / model)},
        "route_trial_steps": 2 * plan.TRIAL_TURNS,
    }


@pytest.mark.parametrize(
    "sparse, dense, kept",
    [
        (1.02, 1.16, ALL_ALLGATHER),  # a mix slower than both extremes: the faster one
        (1.16, 1.02, plan.ALL_DENSE),
        (1.10, 1.10, ALL_ALLGATHER),  # a tie between them: the sparser
        (1.30, 1.21, plan.MODEL),  # dense 2.4% faster than the model: within the margin
        (1.40, 1.50, plan.MODEL),
    ],
)
def test_a_mix_is_tried_against_both_extremes_and_the_fastest_kept(sparse, dense, kept):
    """The model sends some tensors dense and some sparse (1.24 s a step): tried against all
    sparse and all dense, the trial keeps whichever is fastest by more than the margin."""
    trial = plan.RouteTrial(2, (ALL_ALLGATHER, plan.ALL_DENSE), (ALL_ALLGATHER,))
    sides = [plan.MODEL, ALL_ALLGATHER, plan.ALL_DENSE]
    assert [trial.arm(step) for step in range(2, 9)] == [ALL_ALLGATHER] + sides * 2
    trial.add_round([1.24, sparse, dense] * plan.TRIAL_TURNS)
    assert trial.winner == kept and trial.rounds == 1
    assert trial.shown(20)["route_trial_ratios"] == pytest.approx(
        {ALL_ALLGATHER: sparse / 1.24, plan.ALL_DENSE: dense / 1.24}
    )


def test_routes_all_allgather_by_the_model_are_tried_against_the_other_routes():
    """Both tensors handed at the very end of the backward: nothing is hidden and the model sends
    both by allgather, so the trial's other sides send every tensor by SparDL and dense. The
    measuring step routes by the model, the next by SparDL (both uncounted), then the steps take
    turns."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.0, "late": 0.0}, EARLY_AND_LATE)
    planner.use_measurement(GBIT, None, {"early": 0.0, "late": 0.0})
    all_sparse, all_dense = {"early": "allgather", "late": "allgather"}, {"early": "dense", "late": "dense"}
    all_spardl = {"early": "spardl", "late": "spardl"}
    assert _step(planner, EARLY_AND_LATE, 2.0) == all_sparse
    assert planner.auto.trial.alternatives == (ALL_SPARDL, plan.ALL_DENSE)
    assert planner.auto.trial.warming == (plan.MODEL, ALL_SPARDL)
    turns = [_step(planner, EARLY_AND_LATE, 3.0 + step) for step in range(7)]
    assert turns == [all_spardl] + [all_sparse, all_spardl, all_dense] * 2
    assert planner.choices["early"]["route_trial"] == plan.ALL_DENSE
    assert (
        planner.choices["early"]["predicted_seconds"]["allgather"]
        < planner.choices["early"]["predicted_seconds"]["dense"]
    )  # the model's prediction stays shown


def test_tensors_the_settings_send_dense_occupy_the_link_too():
    """A 1M-element bias (the policy sends 1-D tensors dense) handed 50 ms before the end keeps
    the link busy until -18 ms: `w`, handed 40 ms before the end, is hidden only 18 ms."""
    gbit = Network(bandwidth=1.25e8, latency=5e-5, copy_bandwidth=1e10)
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    planner.auto.watch_backward()
    for _ in range(2):
        assert planner.route("bias", 10**6, 1, 4, 0.001, 2) == "dense"
        planner.auto.backward.note_handoff("bias", 0.0)
        planner.route("w", 10**6, 2, 4, 0.001, 2)
        planner.auto.backward.note_handoff("w", 0.01)
        planner.auto.backward.note_handoff("last", 0.05)
        planner.auto.backward.note_decompress()
    planner.use_measurement(gbit, None, planner.auto.backward.windows)
    planner.route("w", 10**6, 2, 4, 0.001, 2)
    dense_wire = cost.local_and_wire(10**6, 1000, 4, 4, 2, gbit)["dense"][1]
    assert planner.choices["w"]["hidden_seconds"] == pytest.approx(0.05 - dense_wire)


def test_the_network_is_measured_only_after_the_watched_steps():
    from sparsecomm.core.compressor import Settings

    class Watching(Settings):
        def __init__(self):
            self._configure(methods.TopK("TopK", 0.001))
            self.planner.auto.watch_backward()
            self.measures = 0

        def _ranks(self):
            return 2

        def _measure_network(self):
            self.measures += 1
            return SLOW, None, dict(self.planner.auto.backward.windows)

        _allgather_ints = _shared_state = _adopt_shared_state = None  # no collective here

    world = Watching()
    for step in range(4):
        assert world._routing_ranks(2, measure=True) == 2
        world.planner.route("w", 10**6, 2, 4, 0.001, 2)
        world.planner.auto.backward.note_handoff("w", float(step))
        world.planner.auto.backward.note_decompress()
        assert world.measures == (1 if step >= 2 else 0)
    assert world.planner.choices["w"]["exchange"] == "allgather"  # 2 ranks on SLOW, nothing hidden


def test_rtopk_draws_with_each_ranks_own_seed():
    """rTop-k's draw is each rank's own: rank 0 keeps the seed, every rank's differs, the
    uint64 wraps; RandomK and RandomBlock keep one seed for all (they have no seed_of)."""
    method = methods.RTopK("RTopK", 0.1, seed=7)
    assert method.seed_of(0) == 7
    seeds = [method.seed_of(rank) for rank in range(1024)]
    assert len(set(seeds)) == 1024 and all(0 <= s < 2**64 for s in seeds)
    assert methods.RTopK("RTopK", 0.1, seed=2**64 - 1).seed_of(1) == 0x9E3779B97F4A7C14
    assert not hasattr(methods.RandomK("RandomK", 0.1, seed=7), "seed_of")
