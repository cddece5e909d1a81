"""exchange="auto" on the training: the watch of the backward, the route trial (which sides it
tries, how it times them, when it decides) and the decision kept across a restart, against
hand-computed step times (sparsecomm.core.plan, sparsecomm.core.trial)."""

import json

import pytest

from sparsecomm.core import cost, methods, plan, trial
from sparsecomm.core.cost import Network
from sparsecomm.core.plan import Planner, Policy

SLOW = Network(bandwidth=1e7, latency=1e-6)
FAST = Network(bandwidth=1e12, latency=0.0, copy_bandwidth=1e8)


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
    """Two steps of watching, ending at 0.0 and 1.0 s: each tensor routed (by allgather
    meanwhile) and handed `windows` seconds before the end of the backward."""
    planner.auto.watch_backward()
    for step in range(2):
        planner.auto.steps.note_compress()
        for name, numel in shapes.items():
            assert planner.route(name, numel, 2, 4, density, ranks) == trial.WATCH_ROUTE
            assert planner.choices[name] == {"exchange": "allgather", "watching_backward": True}
            planner.auto.backward.note_handoff(name, 100.0 - windows[name])
        planner.auto.backward.note_handoff("last", 100.0)  # the first layer's gradient, the end of the backward
        planner.auto.backward.note_decompress()
        planner.auto.steps.note_decompress(float(step))
    assert not planner.watching() and planner.auto.backward.windows == pytest.approx(dict(windows, last=0.0))


GBIT = Network(bandwidth=1.25e8, latency=5e-5, copy_bandwidth=1e10)
EARLY_AND_LATE = {"early": 10**6, "late": 10**6}
ALL_ALLGATHER, ALL_SPARDL = trial.every_tensor("allgather"), trial.every_tensor("spardl")


def test_auto_sends_by_allgather_while_it_watches_the_backward_then_leaves_hidden_exchanges_dense():
    """1 Gbit/s, 2 ranks, 1M-element tensors: dense's wire is 32 ms, allgather's pack costs the
    copy estimate (1.6 ms). `early` is handed 50 ms before the end of the backward: its dense
    exchange is hidden, so it stays dense. `late` is handed 31 ms before the end, but the link
    is busy with `early`'s 32 ms until -18 ms: 14 ms of its dense exchange would stick out, and
    it goes sparse. Alone on the link it would have 31 ms hidden and stay dense. Without the
    windows both would go sparse. The model sends one dense and one sparse, so its routes are
    tried against every tensor by allgather, by SparDL and dense (the watched step's time unknown
    here: every side is tried): the measuring step routes by the model, the next all by SparDL
    (both uncounted, each a route's first use; the watch was allgather's), the next one by the
    model."""
    dense_wire = cost.local_and_wire(10**6, 1000, 4, 4, 2, GBIT)["dense"][1]
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.05, "late": 0.031}, EARLY_AND_LATE)
    assert planner.needs_network(2)
    planner.use_measurement(GBIT, None, {"early": 0.05, "late": 0.031, "frozen": 0.0})
    assert _step(planner, EARLY_AND_LATE, 2.0) == {"early": "dense", "late": "allgather"}
    assert planner.auto.trial.alternatives == (ALL_ALLGATHER, ALL_SPARDL, trial.ALL_DENSE)
    assert planner.auto.trial.warming == (trial.MODEL, ALL_SPARDL)
    assert planner.auto.trial.counted_from == plan.first_counted_step() == 4
    assert planner.choices["early"]["route_trial"] == trial.MODEL
    assert _step(planner, EARLY_AND_LATE, 2.5) == {"early": "spardl", "late": "spardl"}
    assert _step(planner, EARLY_AND_LATE, 3.0) == {"early": "dense", "late": "allgather"}
    assert planner.choices["early"]["hidden_seconds"] == pytest.approx(0.05)
    assert planner.choices["late"]["hidden_seconds"] == pytest.approx(0.05 - dense_wire)
    assert planner.choices["late"]["route_trial"] == trial.MODEL
    alone = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(alone, {"late": 0.031}, {"late": 10**6})
    alone.use_measurement(GBIT, None, {"late": 0.031})
    assert _step(alone, {"late": 10**6}, 2.0) == {"late": "dense"}  # the measuring step: the model's
    assert _step(alone, {"late": 10**6}, 2.5) == {"late": "spardl"}
    assert _step(alone, {"late": 10**6}, 3.0) == {"late": "dense"}
    assert alone.auto.trial.alternatives == (ALL_ALLGATHER, ALL_SPARDL)  # the model sends nothing sparse
    planner.forget_measurement()  # a new world watches again
    assert planner.auto.trial is None and planner.auto.steps.step == 0
    assert planner.watching() and planner.route("early", 10**6, 2, 4, 0.001, 2) == "allgather"
    unwatched = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", GBIT)
    unwatched.auto.watch_backward()  # a network the user gave: nothing measured, nothing watched or tried
    assert not unwatched.watching() and unwatched.route("early", 10**6, 2, 4, 0.001, 2) == "allgather"
    assert "hidden_seconds" not in unwatched.choices["early"] and "route_trial" not in unwatched.choices["early"]
    assert unwatched.auto.steps is None and unwatched.auto.trial is None


def test_final_routes_are_decided_once_and_again_when_the_network_or_the_world_changes():
    """The steady state decides nothing again: once the trial is decided, a route is kept per
    tensor and inputs (a new density or count of ranks decides again). A new world watches again
    (by allgather meanwhile), and a new network decides again, whatever was kept."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"w": 0.0}, {"w": 10**6})
    planner.use_measurement(GBIT, None, {"w": 0.0})
    decided, decide = [], planner._decide
    planner._decide = lambda *args: decided.append(args[0]) or decide(*args)
    assert planner.auto.trial is None
    trying = 2 + 3 * trial.TRIAL_TURNS  # the measuring step, all SparDL's first, and a round: decided at every step
    for step in range(trying):
        _step(planner, {"w": 10**6}, 3.0 + step)
    assert len(decided) == trying and planner.auto.trial.alternatives == (ALL_SPARDL, trial.ALL_DENSE)
    planner.auto.steps.note_compress()
    planner.auto.add_trial_round([1.0, 2.0, 2.0] * trial.TRIAL_TURNS)  # the model's routes faster in every turn: kept
    decided.clear()
    assert [planner.route("w", 10**6, 2, 4, 0.001, 2) for _ in range(3)] == ["allgather"] * 3
    assert decided == ["w"]  # once, then kept
    assert planner.route("w", 10**6, 2, 4, 0.5, 2) == "dense" and decided == ["w"] * 2  # another density
    assert planner.route("w", 10**6, 2, 4, 0.001, 3) == "allgather" and decided == ["w"] * 3  # other ranks
    assert planner.route("w", 10**6, 2, 4, 0.001, 3) == "allgather" and decided == ["w"] * 3
    planner.forget_measurement()  # a new world: watched again (by allgather), the decision kept
    assert planner.watching() and planner.route("w", 10**6, 2, 4, 0.001, 3) == "allgather"
    assert planner.auto.kept["winner"] == trial.MODEL and planner.auto.kept["ranks"] == 2
    unwatched = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    unwatched.use_measurement(GBIT, None)
    assert unwatched.route("w", 10**6, 2, 4, 0.001, 2) == "allgather"
    unwatched.use_measurement(FAST, None)  # copies slower than the link: decided again
    assert unwatched.route("w", 10**6, 2, 4, 0.001, 2) == "dense"


def test_auto_routes_hierarchical_where_the_hosts_were_measured():
    """A measurement with cost.Hosts (the hosts' process sets registered: 2 hosts of 4 ranks, a
    10 GB/s link inside a host, 1 Gbit/s NICs) lets auto route "hierarchical" for a method that
    can use SparDL, by the model and as a side of the trial (warmed after all SparDL); never
    for 1-bit codes (no SparDL), without Hosts, or where the way in lacks it (the DDP hook); a new
    world forgets the hosts with the network."""
    hosts = cost.Hosts(2, 4, Network(bandwidth=1e10, latency=1e-5))
    shapes = {"early": 10**6, "late": 10**6}
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.5, "late": 0.0}, shapes, ranks=8)  # `early`'s dense exchange is hidden
    planner.use_measurement(GBIT, None, {"early": 0.5, "late": 0.0}, hosts)
    warming = [trial.MODEL, ALL_SPARDL, trial.every_tensor("hierarchical")]
    by_model = {"early": "dense", "late": "hierarchical"}
    assert planner.auto.trial is None and _step(planner, shapes, 2.0, ranks=8) == by_model
    assert planner.auto.trial.warming == tuple(warming) and planner.auto.trial.alternatives[-1] == trial.ALL_DENSE
    assert planner.auto.trial.counted_from == plan.first_counted_step(hosts=True) == 5
    for i, side in enumerate(warming[1:]):
        assert _step(planner, shapes, 2.1 + i, ranks=8) == dict.fromkeys(shapes, trial.route_of(side))
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
            other.auto.limit_to(available)
        other.use_measurement(GBIT, None, None, measured_hosts)
        assert other.route("w", 10**6, 2, 4, 0.001, 8) == "allgather", method.owner


def _trial_planner():
    """A planner after the watch (steps 0, 1) whose model sends `early` dense and `late` by
    allgather: its routes are tried against all allgather, all SparDL and all dense, after the
    measuring step (2, the model's routes) and all SparDL's first step (3), not counted."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.05, "late": 0.031}, EARLY_AND_LATE)
    planner.use_measurement(GBIT, None, {"early": 0.05, "late": 0.031})
    return planner


SIDES = (trial.MODEL, ALL_ALLGATHER, ALL_SPARDL, trial.ALL_DENSE)
ROUTES = {
    trial.MODEL: {"early": "dense", "late": "allgather"},
    ALL_ALLGATHER: {"early": "allgather", "late": "allgather"},
    ALL_SPARDL: {"early": "spardl", "late": "spardl"},
    trial.ALL_DENSE: {"early": "dense", "late": "dense"},
}
BY_MODEL = ROUTES[trial.MODEL]
COUNTED_FROM = plan.first_counted_step()  # 4: after the watch (0, 1) and the warming steps (2, 3)


def _warmed(planner):
    """The trial's uncounted steps (2, 3): by the model's routes, then every tensor by SparDL."""
    for step, side in zip(range(2, COUNTED_FROM), (trial.MODEL, ALL_SPARDL)):
        assert _step(planner, EARLY_AND_LATE, float(step)) == ROUTES[side]
    return float(COUNTED_FROM - 1)


def _trial_round(planner, ended, seconds, sides=SIDES):
    """A round of the trial over `sides`, each step ending `seconds[side][i]` after the previous
    one (i: the turn): checks the turns and the routes of each side, and returns when the last
    ended."""
    for i in range(len(sides) * trial.TRIAL_TURNS):
        side = sides[i % len(sides)]
        ended += seconds[side][i // len(sides)]
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
    decided_at = COUNTED_FROM + len(SIDES) * trial.TRIAL_TURNS
    for step in range(decided_at, decided_at + 3):
        if step > decided_at:
            planner.auto.steps.note_compress()
        routes = {name: planner.route(name, numel, 2, 4, 0.001, 2) for name, numel in EARLY_AND_LATE.items()}
        assert routes == ROUTES[faster]
    shown = planner.choices["early"]
    assert shown["route_trial"] == faster and shown["route_trial_steps"] == len(SIDES) * trial.TRIAL_TURNS
    assert shown["route_trial_seconds"] == pytest.approx({side: 0.3 if side == faster else 0.4 for side in SIDES})
    ratio = {side: 0.75 if side == faster else 1.0 if faster != trial.MODEL else 4 / 3 for side in SIDES[1:]}
    assert shown["route_trial_ratios"] == pytest.approx(ratio)
    kept = planner.auto.steps.ends  # no more than the longest round needs
    assert kept.maxlen == trial.MOST_SIDES * trial.TRIAL_TURNS + 1 and len(kept) == min(kept.maxlen, decided_at)


@pytest.mark.parametrize("agreeing, kept", [(0.90, ALL_ALLGATHER), (1.05, trial.MODEL)])
def test_a_close_route_trial_goes_on_for_its_rounds_then_the_median_pair_decides(agreeing, kept):
    """Turns that disagree (all allgather 10% faster in some, 5% slower in others; all SparDL
    and all dense always 20% slower): the trial goes on, round after round, with all allgather
    alone against the model after the first (the others lost every turn: they cannot be kept).
    The second round's turns all agree (all allgather's ratio `agreeing`), but the first round's
    do not, so it goes on; after TRIAL_ROUNDS rounds the median turn decides: 8 of the 12
    ratios are `agreeing`."""
    planner = _trial_planner()
    ended = _warmed(planner)
    slow = {trial.MODEL: [1.0] * 4, ALL_SPARDL: [1.2] * 4, trial.ALL_DENSE: [1.2] * 4}
    mixed = dict(slow, **{ALL_ALLGATHER: [0.90, 1.05, 0.90, 1.05]})
    rounds = [mixed, dict(slow, **{ALL_ALLGATHER: [agreeing] * 4}), mixed]
    assert len(rounds) == trial.TRIAL_ROUNDS
    for i, seconds in enumerate(rounds):
        sides = SIDES if i == 0 else (trial.MODEL, ALL_ALLGATHER)
        assert planner.auto.trial.sides == sides
        ended = _trial_round(planner, ended, seconds, sides)
        planner.auto.add_trial_round(planner.auto.trial.round_seconds(planner.auto.steps))
        assert planner.auto.trial.rounds == i + 1
        assert (planner.auto.trial.winner is None) == (i + 1 < trial.TRIAL_ROUNDS)
    assert planner.auto.trial.winner == kept and planner.auto.trial.ratio(ALL_ALLGATHER) == pytest.approx(agreeing)
    routes = {name: planner.route(name, numel, 2, 4, 0.001, 2) for name, numel in EARLY_AND_LATE.items()}
    assert routes == ROUTES[kept]
    shown = planner.choices["early"]
    assert shown["route_trial_steps"] == (len(SIDES) + 2 * 2) * trial.TRIAL_TURNS
    assert shown["route_trial_ratios"][ALL_SPARDL] == pytest.approx(1.2)  # from its one round


@pytest.mark.parametrize(
    "ratios, left",
    [
        ({"a": [0.8] * 4, "b": [0.9] * 4, "c": [0.9, 1.1, 0.9, 1.1]}, ("a",)),  # b, c slower than the leader a
        (
            {"a": [0.8] * 4, "b": [0.9, 0.9, 0.7, 0.9], "c": [1.0] * 4},
            ("a", "b"),
        ),  # b beat a once; c never beat the model
        ({"a": [0.9, 1.1, 0.9, 1.1], "b": [1.1, 0.9, 1.1, 0.9], "c": [0.98] * 4}, ("a", "b")),  # no leader
        ({"a": [1.0] * 4, "b": [0.97] * 4}, ()),  # not by the margin: the model's routes
    ],
)
def test_after_a_round_only_the_sides_that_can_still_be_kept_go_on(ratios, left):
    """A side goes on where it beat the model by the margin in some turn and, where a side beat
    it in every turn (the leader, the lowest median of those), beat the leader in some turn."""
    tried = trial.RouteTrial(2, tuple(ratios))
    turns = [[1.0] + [ratios[side][turn] for side in ratios] for turn in range(trial.TRIAL_TURNS)]
    tried.add_round([x for turn in turns for x in turn])
    assert tried.alternatives == left and tried.sides == (trial.MODEL, *left)
    assert set(tried.ratios) == set(ratios)  # each side's turns stay shown
    if len(left) == 1 and all(r < 1 - trial.TRIAL_MARGIN for r in ratios[left[0]]):
        assert tried.winner == left[0]


@pytest.mark.parametrize(
    "model, alternative, kept",
    [
        (1.0, 1.0, trial.MODEL),  # a tie
        (1.0, 0.98, trial.MODEL),  # 2% faster: within TRIAL_MARGIN (3%), the trial cannot tell it apart
        (1.0, 0.971, trial.MODEL),
        (1.0, 0.969, ALL_ALLGATHER),  # faster by more than the margin
        (0.5, 1.0, trial.MODEL),
    ],
)
def test_the_alternative_must_beat_the_model_by_the_trial_margin(model, alternative, kept):
    """Every turn alike: decided after one round, by the margin."""
    tried = trial.RouteTrial(2, (ALL_ALLGATHER,))
    tried.add_round([model, alternative] * trial.TRIAL_TURNS)
    assert tried.winner == kept and tried.arm(20) == kept and tried.rounds == 1
    assert tried.shown(20) == {
        "route_trial": kept,
        "route_trial_seconds": {trial.MODEL: model, ALL_ALLGATHER: alternative},
        "route_trial_ratios": {ALL_ALLGATHER: pytest.approx(alternative / model)},
        "route_trial_steps": 2 * trial.TRIAL_TURNS,
        # the slower side's steps cost their difference each: what the trial paid beyond the faster
        "route_trial_extra_seconds": pytest.approx(trial.TRIAL_TURNS * abs(model - alternative)),
        "route_trial_skipped": {},
        "route_trial_predicted": {},
    }


@pytest.mark.parametrize(
    "sparse, dense, kept",
    [
        (1.02, 1.16, ALL_ALLGATHER),  # a mix slower than both extremes: the faster one
        (1.16, 1.02, trial.ALL_DENSE),
        (1.10, 1.10, ALL_ALLGATHER),  # a tie between them: the sparser
        (1.30, 1.21, trial.MODEL),  # dense 2.4% faster than the model: within the margin
        (1.40, 1.50, trial.MODEL),
    ],
)
def test_a_mix_is_tried_against_both_extremes_and_the_fastest_kept(sparse, dense, kept):
    """The model sends some tensors dense and some sparse (1.24 s a step): tried against all
    sparse and all dense, the trial keeps whichever is fastest by more than the margin."""
    tried = trial.RouteTrial(2, (ALL_ALLGATHER, trial.ALL_DENSE), (ALL_ALLGATHER,))
    sides = [trial.MODEL, ALL_ALLGATHER, trial.ALL_DENSE]
    assert [tried.arm(step) for step in range(2, 9)] == [ALL_ALLGATHER] + sides * 2
    tried.add_round([1.24, sparse, dense] * trial.TRIAL_TURNS)
    assert tried.winner == kept and tried.rounds == 1
    assert tried.shown(20)["route_trial_ratios"] == pytest.approx(
        {ALL_ALLGATHER: sparse / 1.24, trial.ALL_DENSE: dense / 1.24}
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
    assert planner.auto.trial.alternatives == (ALL_SPARDL, trial.ALL_DENSE)
    assert planner.auto.trial.warming == (trial.MODEL, ALL_SPARDL)
    turns = [_step(planner, EARLY_AND_LATE, 3.0 + step) for step in range(7)]
    assert turns == [all_spardl] + [all_sparse, all_spardl, all_dense] * 2
    assert planner.choices["early"]["route_trial"] == trial.ALL_DENSE
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
            super().__init__(methods.TopK("TopK", 0.001))
            self.planner.auto.watch_backward()
            self.measures = 0

        def _ranks(self):
            return 2

        def _measure_network(self, device):
            self.measures += 1
            return SLOW, None, dict(self.planner.auto.backward.windows)

        _allgather_ints = _shared_state = _adopt_shared_state = pack = None  # no collective, no pack here

    world = Watching()
    for step in range(4):
        assert world._prepare_routing(2, measure=True) == 2
        world.planner.route("w", 10**6, 2, 4, 0.001, 2)
        world.planner.auto.backward.note_handoff("w", float(step))
        world.planner.auto.backward.note_decompress()
        assert world.measures == (1 if step >= 2 else 0)
    assert world.planner.choices["w"]["exchange"] == "allgather"  # 2 ranks on SLOW, nothing hidden


@pytest.mark.parametrize(
    "predicted, tried, skipped",
    [
        ({trial.MODEL: 1.0, "all spardl": 1.2, "all dense": 2.5}, ("all spardl",), {"all dense": 2.5}),
        ({trial.MODEL: 1.0, "all spardl": 2.0, "all dense": 2.001}, ("all spardl",), {"all dense": 2.001}),
        ({trial.MODEL: 2.0, "all spardl": 1.0, "all dense": 2.0}, ("all spardl", "all dense"), {}),  # 2x: tried
        (None, ("all spardl", "all dense"), {}),  # the model's figures not to be trusted: every side
    ],
)
def test_a_side_is_tried_only_within_the_prune_margin_of_the_fastest_prediction(predicted, tried, skipped):
    """PRUNE_MARGIN (2x) of the fastest predicted side, the model's own included; the warm-up
    steps: the model's routes, then each tried sparse side but the watched one (allgather)."""
    candidates = ["all spardl", "all dense"]
    alternatives, warming, ratios = trial.sides_to_try(candidates, predicted)
    best = min(predicted.values()) if predicted else None
    assert ratios == ({side: seconds / best for side, seconds in predicted.items()} if predicted else {})
    assert alternatives == tried
    assert trial.RouteTrial(2, alternatives, warming, ratios).skipped == pytest.approx(skipped)
    assert warming == (trial.MODEL, *(s for s in tried if s == "all spardl"))
    assert trial.sides_to_try([ALL_ALLGATHER], {trial.MODEL: 1.0, ALL_ALLGATHER: 1.0})[1] == (trial.MODEL,)


def _exposed(numel, ranks=2, network=GBIT):
    """Per route, the seconds one untouched (nothing hidden) tensor of TopK 0.1% adds to a step."""
    parts = cost.local_and_wire(numel, numel // 1000, 4, 4, ranks, network)
    return {route: local + wire for route, (local, wire) in parts.items()}


@pytest.mark.parametrize("watched_step, dense_tried", [(0.05, False), (1.0, True), (0.002, True)])
def test_the_trial_skips_all_dense_where_the_model_predicts_it_hopeless(watched_step, dense_tried):
    """1 Gbit/s, 2 ranks, two 1M-element tensors handed at the end of the backward: the model
    sends both by allgather (3.4 ms a step), dense would add 64 ms. On a 50 ms watched step the
    model predicts all dense at 2.3x the best side: not tried, and its predicted ratio shown. On
    a 1 s step it would be 1.06x: tried. Where the model predicts the watched routing alone
    slower than the whole watched step (2 ms), its figures are wrong: every side is tried."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.0, "late": 0.0}, EARLY_AND_LATE)
    planner.use_measurement(GBIT, None, {"early": 0.0, "late": 0.0}, None, watched_step)
    assert _step(planner, EARLY_AND_LATE, 2.0) == {"early": "allgather", "late": "allgather"}
    tried = planner.auto.trial
    assert tried.alternatives == ((ALL_SPARDL, trial.ALL_DENSE) if dense_tried else (ALL_SPARDL,))
    assert tried.warming == (trial.MODEL, ALL_SPARDL)
    predicted = {trial.MODEL, ALL_SPARDL, trial.ALL_DENSE} if watched_step > 0.01 else set()
    assert set(tried.predicted) == predicted and min(tried.predicted.values(), default=1.0) == 1.0
    if not dense_tried:
        added = {route: 2 * seconds for route, seconds in _exposed(10**6).items()}
        base = watched_step - added["allgather"]
        best = base + min(added["allgather"], added["spardl"])
        assert tried.skipped == {trial.ALL_DENSE: pytest.approx((base + added["dense"]) / best)}
        assert tried.skipped[trial.ALL_DENSE] > trial.PRUNE_MARGIN
    else:
        assert tried.skipped == {}


def test_a_trial_with_no_side_that_could_win_is_decided_at_once():
    """1-bit Threshold has no SparDL: its only other side is all dense, which the model predicts
    hopeless on a short step. Nothing is tried: the model's routes stand from the measuring step
    on, the StepClock stops, and stats() shows the skipped side and no counted step."""
    planner = Planner("Threshold", methods.Threshold("Threshold", 0.001, quantize="1bit"), Policy(), "auto", None)
    _watched(planner, {"early": 0.0, "late": 0.0}, EARLY_AND_LATE)
    planner.use_measurement(GBIT, None, {"early": 0.0, "late": 0.0}, None, 0.02)
    assert _step(planner, EARLY_AND_LATE, 2.0) == {"early": "allgather", "late": "allgather"}
    assert planner.auto.trial.winner == trial.MODEL and not planner.timing_steps()
    shown = planner.choices["early"]
    assert shown["route_trial"] == trial.MODEL and shown["route_trial_steps"] == 0
    assert list(shown["route_trial_skipped"]) == [trial.ALL_DENSE] and shown["route_trial_extra_seconds"] == 0.0
    assert shown["route_trial_predicted"][trial.MODEL] == 1.0  # the model's routes: the fastest prediction


def _decided(planner, windows, shapes, hosts=None, ranks=2):
    """A planner whose trial kept all SparDL after one round (every turn 25% faster)."""
    _watched(planner, windows, shapes, ranks=ranks)
    planner.use_measurement(GBIT, cost.LocalCost(1e-4, 1e-9, 2e-9), windows, hosts, 1.0)
    ended = 2.0
    while planner.auto.trial is None or planner.auto.trial.winner is None:
        if planner.auto.round_ended():
            sides = len(planner.auto.trial.sides)
            planner.auto.add_trial_round(
                ([1.0] + [0.75 if s == ALL_SPARDL else 1.0 for s in planner.auto.trial.alternatives])
                * trial.TRIAL_TURNS
                if sides
                else []
            )
            continue
        ended += 1.0
        _step(planner, shapes, ended, ranks=ranks)
    return {name: planner.route(name, numel, 2, 4, 0.001, ranks) for name, numel in shapes.items()}


def _no_hosts():
    raise AssertionError("host_layout is collective: called only where the kept decision had hosts")


def test_a_restarted_job_of_the_same_shape_keeps_the_decision_and_tries_nothing():
    """The decision travels as plain numbers (a checkpoint's, and the ranks' agreement check's
    JSON). A fresh planner that keeps it routes as the old one did from its first step, with the
    same hidden seconds: no watch, no measurement, no trial. On another number of ranks, or
    hosts of another layout, it is dropped and auto watches afresh."""
    windows = {"early": 0.05, "late": 0.031}
    old = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    routes = _decided(old, windows, EARLY_AND_LATE)
    assert routes == {"early": "spardl", "late": "spardl"}
    saved = old.saved_decision()
    assert json.loads(json.dumps(saved)) == saved and saved["exchange_auto"]["winner"] == ALL_SPARDL
    new = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    new.auto.watch_backward()
    new.keep_decision(json.loads(json.dumps(saved)))
    assert new.needs_network(2)
    new.adopt_kept_decision(2, _no_hosts)
    assert not new.watching() and not new.needs_network(2) and not new.timing_steps()
    new.auto.steps.note_compress()
    assert {name: new.route(name, numel, 2, 4, 0.001, 2) for name, numel in EARLY_AND_LATE.items()} == routes
    for name in EARLY_AND_LATE:
        assert new.choices[name]["hidden_seconds"] == old.choices[name]["hidden_seconds"]
        assert new.choices[name]["predicted_seconds"] == old.choices[name]["predicted_seconds"]
    assert new.saved_decision() == saved  # a resumed job saves it again
    other = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    other.auto.watch_backward()
    other.keep_decision(saved)
    other.adopt_kept_decision(3, _no_hosts)  # another world: dropped
    assert other.auto.kept is None and other.watching() and other.needs_network(3)
    assert Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None).saved_decision() == {
        "exchange_auto": None
    }


@pytest.mark.parametrize("layout, adopted", [((2, 4), True), ((4, 2), False), (None, False)])
def test_a_kept_decision_on_hosts_needs_hosts_of_the_same_layout(layout, adopted):
    hosts = cost.Hosts(2, 4, Network(bandwidth=1e10, latency=1e-5))
    old = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _decided(old, {"early": 0.5, "late": 0.0}, EARLY_AND_LATE, hosts, ranks=8)
    new = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    new.auto.watch_backward()
    new.keep_decision(old.saved_decision())
    new.adopt_kept_decision(8, lambda: layout)
    assert new.watching() != adopted and (new.auto.hosts == hosts) == adopted


@pytest.mark.parametrize(
    "density, ranks, route",
    [(0.001, 2, "allgather"), (0.001, 64, "allgather"), (0.25, 2, "allgather"), (0.25, 16, "dense"), (0.7, 2, "dense")],
)
def test_the_watch_sends_by_allgather_where_it_receives_fewer_bytes_than_dense(density, ranks, route):
    """Before anything is measured, a watched tensor goes by allgather where one rank receives
    fewer bytes that way: (N - 1) sends of k 6-byte rows against dense's 2 (N - 1) / N of the
    tensor (DGC's first warm-up stage, 25%, on 16 ranks: 22.5 against 7.5 bytes an element)."""
    numel = 10**6
    k = int(density * numel)
    assert plan.watch_route(methods.TopK("TopK", 0.001), numel, k, 4, ranks) == route
    allgather = cost.received_bytes("allgather", numel, k, 4, 4, ranks)
    assert (allgather < cost.received_bytes("dense", numel, k, 4, 4, ranks)) == (route == "allgather")


@pytest.mark.parametrize("watched_step, snapped", [(1.0, True), (0.01, False)])
def test_a_mix_not_predicted_enough_faster_runs_as_the_watch_s_route(watched_step, snapped):
    """The model sends `early` dense (hidden) and `late` by allgather. On a 1 s watched step it
    predicts that mix 0.2% faster than every tensor by allgather, the watch's route: less than
    MIX_MARGIN, so the model's side routes every tensor by allgather, from the measuring step to
    the decision, which names that side. On a 10 ms step the mix is predicted 20% faster: tried
    as it is."""
    planner = Planner("TopK", methods.TopK("TopK", 0.001), Policy(), "auto", None)
    _watched(planner, {"early": 0.05, "late": 0.031}, EARLY_AND_LATE)
    planner.use_measurement(GBIT, None, {"early": 0.05, "late": 0.031}, None, watched_step)
    measuring = _step(planner, EARLY_AND_LATE, 2.0)
    tried = planner.auto.trial
    assert (tried.model_route == "allgather") == snapped and (ALL_ALLGATHER in tried.alternatives) != snapped
    assert measuring == (ROUTES[ALL_ALLGATHER] if snapped else BY_MODEL)
    assert ALL_ALLGATHER not in tried.predicted if snapped else tried.predicted[ALL_ALLGATHER] > 1 + trial.MIX_MARGIN
    ended = 2.0
    while planner.auto.trial.winner is None:  # the model's side fastest in every turn
        if planner.auto.round_ended():
            sides = planner.auto.trial.sides
            planner.auto.add_trial_round(([0.5] + [1.0] * (len(sides) - 1)) * trial.TRIAL_TURNS)
            continue
        ended += 1.0
        _step(planner, EARLY_AND_LATE, ended)
    assert tried.winner == (ALL_ALLGATHER if snapped else trial.MODEL)
    assert {name: planner.route(name, n, 2, 4, 0.001, 2) for name, n in EARLY_AND_LATE.items()} == (
        ROUTES[ALL_ALLGATHER] if snapped else BY_MODEL
    )
