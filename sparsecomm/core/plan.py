"""How each tensor travels: the per-layer policy and the exchange decision, written once.

Routes (what `Planner.route` returns):
  "dense"      Horovod's own allreduce of the whole tensor (policy, dense fallback, or the
               cost model predicted no sparse exchange 20% faster: cost.choose);
  "shared"     the packed values of a shared-coordinate method on Horovod's allreduce;
  "allgather"  values and indices of every rank (sparsecomm.<framework>.exchange);
  "spardl"     sparse reduce-scatter + all-gather;
  "hierarchical" SparDL inside each host, then the hosts' rows between hosts (auto: where the
               hosts' process sets are registered, the adapter measures their link: cost.Hosts).
Nothing here starts a collective: the network exchange="auto" needs is measured by the
framework adapter (`needs_network`) and handed in. An adapter that can time Horovod's hooks
(PyTorch's) first lets the planner watch the backward pass (`watch_backward`): auto sends
dense for OBSERVED_STEPS steps while it records when each gradient is handed over, and then
chooses with the overlap of each exchange and the backward (cost.hidden_times). It then tries
its choice on the training (RouteTrial): it times turns of steps, one routed by the model and
one by each route the method can take sending every tensor that way (dense, allgather, SparDL,
hierarchical where it runs), but the model's own where it sends every tensor one way, in
rounds of TRIAL_TURNS turns, until every turn agrees on whether each of them is faster than
the model by more than TRIAL_MARGIN, or for TRIAL_ROUNDS rounds, when the median turn decides;
the fastest that beats the model by the margin is kept, else the model's routes.
"""

import collections
import fnmatch
import statistics
from dataclasses import dataclass

from . import cost, validate
from .selection import selected_count
from .wire import MAX_INDEXED_NUMEL, buckets, rows_bytes

# Steps auto watches (sending dense) before it chooses: the first step is slower than the rest
# (first allocations, Horovod's first negotiation of each tensor), so the last one's windows count.
OBSERVED_STEPS = 2
# The route trial's schedule. The step after the watch measures the network; it and one step
# for each further sparse route are not counted: each pays a route's first use. Then turns of
# steps, one step of each side (the model's routes, then each alternative's): adjacent steps
# see the machine alike, so a turn's ratios are steadier than medians. After each round of
# TRIAL_TURNS turns the trial decides if every turn agrees; after TRIAL_ROUNDS rounds the
# median turn decides (docs/exchanges.md, step 4).
TRIAL_TURNS = 4
TRIAL_ROUNDS = 3
MODEL = "model"  # the side of a RouteTrial that routes by the model; the others: every_tensor(route)
MOST_SIDES = 2 + len(cost.SPARSE)  # the model's routes, all dense, and every tensor by each sparse route
TRIAL_STEPS = MOST_SIDES * TRIAL_TURNS * TRIAL_ROUNDS  # the most counted steps
# How much faster than the model's routes an alternative must be to be kept: within it the
# model's routes, which rest on measurements of their own, stand.
TRIAL_MARGIN = 0.03


def first_counted_step(hosts=False):
    """The first step auto's route trial times, where it watches (0-based): after the watch, the
    measuring step and one uncounted step for each further sparse route (hierarchical's where
    the hosts were measured)."""
    sparse = [route for route in cost.SPARSE if hosts or route != cost.HIERARCHICAL]
    return OBSERVED_STEPS + len(sparse)


# The most steps before auto's routes are final where it watches: the watch, the measuring step
# and the trial (a benchmark warms up this long before it times auto).
SETTLING_STEPS = first_counted_step(hosts=True) + TRIAL_STEPS


def every_tensor(route):
    """The side of a RouteTrial that sends every tensor auto routes by `route`."""
    return f"all {route}"


def route_of(side):
    """The route of an every_tensor side."""
    return side.removeprefix(every_tensor(""))


ALL_DENSE = every_tensor("dense")


@dataclass(frozen=True)
class Policy:
    """The per-layer policy (every compressor): a tensor goes dense when it has fewer than
    ``min_numel`` elements, when it is 1-D and ``dense_1d`` (biases, norm scales: the DGC paper
    compresses only tensors of dim > 1), or when its name matches one of the fnmatch patterns in
    ``dense`` (e.g. ``["*.embedding.*"]``)."""

    min_numel: int = 1024
    dense_1d: bool = True
    dense: tuple = ()

    @classmethod
    def checked(cls, owner, min_numel=1024, dense_1d=True, dense=()):
        return cls(
            validate.check_count(owner, "min_numel", min_numel, 0),
            validate.check_flag(owner, "dense_1d", dense_1d),
            validate.check_patterns(owner, dense),
        )

    def sends_dense(self, name, numel, ndim):
        return (
            numel < self.min_numel
            or (self.dense_1d and ndim == 1)
            or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.dense)
        )


def sparse_is_larger(k, numel, element_size):
    """The dense fallback: k wire rows (sparsecomm.core.wire) would not be smaller than the tensor."""
    return rows_bytes(k, element_size, 0, numel) >= numel * element_size


class Planner:
    """The route of each tensor at a density: the per-layer policy, the dense fallback, a fixed
    exchange or exchange="auto" (`auto`, an AutoRouter); and the record of what was chosen
    (`choices`, shown by stats()). The same inputs give the same route on every rank."""

    def __init__(self, owner, method, policy, exchange="auto", network=None, dense_fallback=True):
        self.owner, self.method, self.policy = owner, method, policy
        self.shared = method.shared_coordinates
        self.auto = None  # the AutoRouter of exchange="auto"
        if not self.shared:
            self.dense_fallback = validate.check_flag(owner, "dense_fallback", dense_fallback)
            self.exchange, self.network = validate.check_exchange(owner, exchange, network)
            if self.exchange == "auto":
                self.auto = AutoRouter(method, self.network)
        self.choices = {}  # name -> {"exchange", "predicted_seconds"?, "hidden_seconds"?}: what stats() shows
        self._final = {}  # name -> ((numel, ndim, element size, density, ranks), route) once routes are final

    def settings(self):
        if self.shared:
            return {}
        return {"dense_fallback": self.dense_fallback, "exchange": self.exchange, "network": self.network}

    def needs_network(self, ranks):
        """Whether a route needs the network measured first (exchange="auto" on several ranks)."""
        return self.auto is not None and self.auto.needs_network(ranks)

    def watching(self):
        """Whether auto is still watching the backward (see AutoRouter.watch_backward)."""
        return self.auto is not None and self.auto.watching()

    def timing_steps(self):
        """Whether the adapter should still feed auto's StepClock (see AutoRouter.timing_steps)."""
        return self.auto is not None and self.auto.timing_steps()

    def forget_measurement(self):
        """The ranks changed (elastic Horovod): routes chosen on the old world are dropped, and auto
        measures (and watches) again."""
        if self.auto is not None:
            self.auto.forget_measurement()
        self._final.clear()

    def use_measurement(self, network, local, windows=None, hosts=None):
        """What the adapter measured for auto (AutoRouter.use_measurement); routes are chosen anew."""
        self.auto.use_measurement(network, local, windows, hosts)
        self._final.clear()

    def always_dense(self, name, numel, ndim, element_size):
        """Whether the per-layer policy or the dense fallback send this tensor dense at every
        density of the method's schedule (whatever exchange="auto" would choose on a network)."""
        return all(
            self.route(name, numel, ndim, element_size, density, ranks=1, record=False) == "dense"
            for density in self.method.densities()
        )

    def check_indexable(self, name, numel, ndim, element_size):
        """Refuses a tensor of more than MAX_INDEXED_NUMEL elements that would travel with int32
        indices at some density of the method's schedule. Only the policy and the dense fallback
        exempt it, not auto choosing dense, which depends on the network. Starts nothing."""
        if numel > MAX_INDEXED_NUMEL and self.method.indexed and not self.always_dense(name, numel, ndim, element_size):
            raise ValueError(
                f"{self.owner}: {name!r} has {numel} elements, more than {MAX_INDEXED_NUMEL} (2**31 - 1), the most "
                f"that int32 indices can address, so it cannot be sent sparse. List it in dense=[{name!r}] to send "
                f"it dense through Horovod's allreduce, or split the parameter into tensors of at most "
                f"{MAX_INDEXED_NUMEL} elements."
            )

    def route(self, name, numel, ndim, element_size, density, ranks, record=True):
        """How this tensor travels at `density` (see the module docstring). Once routes are final
        (nothing is watched or tried), a route is decided once per tensor and inputs: the steady
        state of a training pays a dict lookup per tensor, not the decision."""
        inputs = (numel, ndim, element_size, density, ranks)
        final = self._final.get(name)
        if final is not None and final[0] == inputs:
            return final[1]
        route = self._decide(name, numel, ndim, element_size, density, ranks, record)
        if record and (self.auto is None or self.auto.routes_final()):
            self._final[name] = (inputs, route)
        return route

    def _decide(self, name, numel, ndim, element_size, density, ranks, record):
        auto = self.auto
        if self.policy.sends_dense(name, numel, ndim):
            if auto is not None:
                auto.note_shape(name, numel, element_size, density, by_auto=False)
            return "dense"
        if self.shared:
            return "shared"
        k = selected_count(density, numel)
        if self.dense_fallback and sparse_is_larger(k, numel, element_size):
            if auto is not None:
                auto.note_shape(name, numel, element_size, density, by_auto=False)
            return self._record(name, record, {"exchange": "dense"})
        if auto is None:
            return self._record(name, record, {"exchange": self.exchange})
        if ranks == 1:
            return "allgather"
        auto.note_shape(name, numel, element_size, density, by_auto=True)
        if auto.watching():
            return self._record(name, record, {"exchange": "dense", "watching_backward": True})
        return self._record(name, record, auto.choose(name, numel, k, element_size, ranks))

    def _record(self, name, record, chosen):
        if record:
            self.choices[name] = chosen
        return chosen["exchange"]


class AutoRouter:
    """exchange="auto": the cost model's route on the network the adapter measured, after watching
    the backward (where the adapter can time Horovod's hooks), then tried on the training against
    the other extreme (RouteTrial). Starts nothing: the adapter measures and hands results in."""

    def __init__(self, method, network=None):
        self.method, self.network = method, network
        self.local = None  # cost.LocalCost of the compressor's sparse path, measured with the network
        self._network_measured = False  # the network was measured here (not the user's): measured again on a new world
        self._cached = {}  # name -> ((k, ranks, side), chosen)
        self.backward = None  # BackwardWindows while auto watches the backward (watch_backward)
        self.available = (*cost.EXCHANGES, cost.HIERARCHICAL)  # the routes the way in provides (DDP: fewer)
        self.hosts = None  # cost.Hosts, measured where the hosts' process sets are registered: hierarchical runs
        self._windows = {}  # name -> seconds of backward after its hand-off, averaged over the ranks
        self._hidden = None  # name -> hidden seconds of its exchange (cost.hidden_times), once computed
        self._shapes = {}  # name -> (numel, element size, density, routed by auto) while watched: hidden_times' queue
        self.steps = None  # StepClock while auto watches and tries its routes (watch_backward)
        self.trial = None  # RouteTrial, once auto chose after watching

    def needs_network(self, ranks):
        return self.network is None and ranks > 1

    def watch_backward(self):
        """Called by an adapter that times Horovod's hooks: where auto will measure the network,
        it first watches OBSERVED_STEPS steps of the backward pass (sending dense meanwhile)."""
        if self.network is None:
            self.backward, self.steps = BackwardWindows(), StepClock()

    def untimed(self, exchanges):
        """For a way in that neither times the hooks nor carries every exchange (the DDP hook):
        no watch and no route trial, and the cost model chooses among `exchanges` only."""
        self.backward, self.steps, self.available = None, None, exchanges

    def watching(self):
        """Whether auto is still watching the backward: measure the network only after it."""
        return self.backward is not None and not self.backward.complete()

    def timing_steps(self):
        """Whether the adapter should still feed the StepClock (its hooks' times): from the watch
        until the route trial is decided (or the measurement found no tensor for auto)."""
        return self.steps is not None and (
            not self._network_measured or (self.trial is not None and self.trial.winner is None)
        )

    def routes_final(self):
        """Whether a route decided now stands for the same inputs: not while auto watches the
        backward or tries its routes (they change with the step)."""
        return not self.watching() and (self.trial is None or self.trial.winner is not None)

    def use_measurement(self, network, local, windows=None, hosts=None):
        """The network and local cost measured by the adapter, where it watched the backward each
        tensor's window averaged over the ranks, and where the hosts' process sets are registered
        the hosts (cost.Hosts, with their link measured): `network` is then a host's NIC."""
        self.network, self.local, self.hosts, self._network_measured = network, local, hosts, True
        self._windows, self._hidden = dict(windows or {}), None
        self._cached.clear()

    def forget_measurement(self):
        """Drops a measured network (not one the user gave) and every route chosen with it."""
        if self._network_measured:
            self.network, self.local, self.hosts, self._network_measured = None, None, None, False
            self._windows, self._hidden = {}, None
        if self.backward is not None:
            self.backward, self.steps = BackwardWindows(), StepClock()
        self.trial = None
        self._cached.clear()

    def note_shape(self, name, numel, element_size, density, by_auto):
        """While auto watches the backward: what each tensor puts on the link (hidden_times)."""
        if self.watching():
            self._shapes[name] = (numel, element_size, density, by_auto)

    def round_ended(self):
        """Whether a round of the route trial has ended and waits for `add_trial_round` (the
        adapter averages its step times, RouteTrial.round_seconds, over the ranks first)."""
        return self.trial is not None and self.trial.round_ended(self.steps)

    def add_trial_round(self, seconds):
        """A round's step seconds, averaged over the ranks (RouteTrial.add_round); nothing cached
        while trying stands."""
        self.trial.add_round(seconds)
        self._cached.clear()

    def choose(self, name, numel, k, element_size, ranks):
        """What auto chooses for this tensor: {"exchange", "predicted_seconds", ...} for stats()."""
        if self.network is None:
            raise RuntimeError("exchange='auto' needs the network: measure it first (Planner.needs_network)")
        if self._hidden is None:
            self._hidden = self._hidden_times(ranks)
            if self.steps is not None:
                self.trial = RouteTrial(self.steps.step, *self._trial_sides(ranks))
        side = MODEL if self.trial is None else self.trial.arm(self.steps.step)
        cached = self._cached.get(name)
        if cached is None or cached[0] != (k, ranks, side):
            cached = self._cached[name] = ((k, ranks, side), self._chosen(name, numel, k, element_size, ranks, side))
        return cached[1]

    def _chosen(self, name, numel, k, element_size, ranks, side):
        hidden = self._hidden.get(name, 0.0)
        choice, predicted = self._cost_choice(numel, k, element_size, ranks, hidden)
        chosen = {"exchange": choice if side == MODEL else route_of(side), "predicted_seconds": predicted}
        if name in self._hidden:
            chosen["hidden_seconds"] = hidden
        if self.trial is not None:
            chosen.update(self.trial.shown(self.steps.step))
        return chosen

    def _routes(self):
        """The method's exchanges, and "hierarchical" where it can use SparDL and hosts were
        measured, that the way in provides."""
        own = self.method.exchanges()
        own = (*own, cost.HIERARCHICAL) if self.hosts is not None and "spardl" in own else own
        return [e for e in own if e in self.available]

    def _cost_choice(self, numel, k, element_size, ranks, hidden):
        """cost.choose for this method on the measured network: (route, every prediction)."""
        size, routes = self.method.value_bytes(element_size), self._routes()
        return cost.choose(numel, k, element_size, size, ranks, self.network, routes, self.local, hidden, self.hosts)

    def _trial_sides(self, ranks):
        """(alternatives, warming) of the RouteTrial: every tensor by each of the method's routes,
        sparse first, but the model's own where it sends every watched tensor one way (a mix can
        be slower than any of them); each sparse side warmed by one uncounted step. With no
        watched tensor: all dense, warmed by the model's routes."""
        chosen = {
            self._cost_choice(numel, selected_count(density, numel), size, ranks, self._hidden.get(name, 0.0))[0]
            for name, (numel, size, density, by_auto) in self._shapes.items()
            if by_auto
        }
        if not chosen:
            return (ALL_DENSE,), (MODEL,)
        own = every_tensor(chosen.pop()) if len(chosen) == 1 else None
        sparse = [every_tensor(route) for route in self._routes() if route != "dense"]
        warming = tuple(MODEL if side == own else side for side in sparse)
        return tuple(side for side in (*sparse, ALL_DENSE) if side != own), warming or (MODEL,)

    def _hidden_times(self, ranks):
        """cost.hidden_times over the watched tensors: each occupies the link for the wire time of
        its route at its density in the last watched step (dense where the settings send it dense)."""

        def wire_seconds(name, hidden):
            numel, size, density, by_auto = self._shapes[name]
            k, value_size = selected_count(density, numel), self.method.value_bytes(size)
            route = self._cost_choice(numel, k, size, ranks, hidden)[0] if by_auto else "dense"
            parts = cost.local_and_wire(numel, k, size, value_size, ranks, self.network, self.local, self.hosts)
            return parts[route][1]

        watched = [(name, window) for name, window in self._windows.items() if name in self._shapes]
        return cost.hidden_times(watched, wire_seconds)


class BackwardWindows:
    """When each gradient of a step was handed to Horovod (the end of compress), and from that the
    window of each: the seconds from its hand-off to the step's last one (the end of the backward
    pass, where nothing is left to overlap an exchange with). A step ends at its first decompress
    (Horovod's synchronize comes after the backward); the windows of the last ended step count."""

    def __init__(self, steps=OBSERVED_STEPS):
        self.steps, self.ended, self.windows = steps, 0, {}
        self._handed = {}  # name -> seconds (perf_counter) of the step under way

    def note_handoff(self, name, now):
        self._handed[name] = now

    def note_decompress(self):
        if self._handed:
            end = max(self._handed.values())
            self.windows = {name: end - now for name, now in self._handed.items()}
            self._handed, self.ended = {}, self.ended + 1

    def complete(self):
        return self.ended >= self.steps


class StepClock:
    """Training steps as Horovod's hooks show them: a step begins at its first compress after a
    decompress, and ends at its last decompress. From one end to the next is a whole step (the
    optimizer's update, the forward, the backward with its packs, the wait and the unpacks).
    `ends` holds when the last MOST_SIDES * TRIAL_TURNS + 1 ended steps ended (perf_counter seconds), the
    last one that of step `step - 1`: what a round of the trial needs, and no more however
    long it runs."""

    def __init__(self):
        self.step, self.ends = 0, collections.deque(maxlen=MOST_SIDES * TRIAL_TURNS + 1)
        self._last = None  # the last decompress of the step under way

    def note_compress(self):
        if self._last is not None:
            self.ends.append(self._last)
            self.step, self._last = self.step + 1, None

    def ended(self, step):
        """When `step` ended (one of the last MOST_SIDES * TRIAL_TURNS + 1 ended steps)."""
        return self.ends[len(self.ends) - (self.step - step)]

    def note_decompress(self, now):
        self._last = now


class RouteTrial:
    """Tries the model's routes on the training itself against `alternatives`, every_tensor
    sides (the model rests on estimates: how much of each exchange the backward hides, and a
    network measured in a few collectives, both of which the training can prove wrong). From
    `first`, the step that measured, the steps route by each side of `warming` in turn, not
    counted (each pays a route's first use); then the steps take the sides in turn (MODEL, then
    each alternative), each timed by the StepClock, in rounds of TRIAL_TURNS turns (see
    TRIAL_TURNS for when it decides)."""

    def __init__(self, first, alternatives, warming=(MODEL,)):
        self.first, self.alternatives, self.warming = first, tuple(alternatives), tuple(warming)
        self.counted_from = first + len(self.warming)
        self.sides = (MODEL, *self.alternatives)
        self.winner = None  # MODEL or an alternative, once decided
        self.seconds = {side: [] for side in self.sides}  # each counted step's seconds, averaged over the ranks
        self.ratios = {side: [] for side in self.alternatives}  # each turn's alternative / model

    @property
    def round_steps(self):
        return TRIAL_TURNS * len(self.sides)

    @property
    def rounds(self):
        """Rounds whose step times were added."""
        return len(self.seconds[MODEL]) // TRIAL_TURNS

    def arm(self, step):
        """How `step` routes."""
        if self.winner is not None:
            return self.winner
        if step < self.counted_from:
            return self.warming[step - self.first]
        return self.sides[(step - self.counted_from) % len(self.sides)]

    def round_ended(self, clock):
        """Whether the round under way has ended (checked at every compress: true first at the
        first compress after its last step, while the clock still holds its steps' ends)."""
        return self.winner is None and clock.step >= self.counted_from + self.round_steps * (self.rounds + 1)

    def round_seconds(self, clock):
        """This rank's step seconds of the round just ended, in step order (a turn: MODEL, then
        each alternative)."""
        start = self.counted_from + self.round_steps * self.rounds  # the StepClock keeps their ends
        return [clock.ended(step) - clock.ended(step - 1) for step in range(start, start + self.round_steps)]

    def add_round(self, seconds):
        """The round's step seconds (round_seconds, averaged over the ranks: the same on every
        rank, and so is the decision). Decides when, for each alternative, every turn so far
        agrees on whether it beats the model by more than TRIAL_MARGIN, or after TRIAL_ROUNDS
        rounds; then keeps the alternative of the lowest median turn ratio among those that beat
        the model by the margin, else the model."""
        n = len(self.sides)
        for i, side in enumerate(self.sides):
            self.seconds[side] += seconds[i::n]
        for i, side in enumerate(self.alternatives, start=1):
            self.ratios[side] += [a / m for m, a in zip(seconds[0::n], seconds[i::n])]
        agreed = all(len({r < 1 - TRIAL_MARGIN for r in ratios}) == 1 for ratios in self.ratios.values())
        if agreed or self.rounds == TRIAL_ROUNDS:
            beating = [side for side in self.alternatives if self.ratio(side) < 1 - TRIAL_MARGIN]
            self.winner = min(beating, key=self.ratio, default=MODEL)

    def ratio(self, side):
        """The median turn's `side` / model."""
        return statistics.median(self.ratios[side])

    def shown(self, step):
        """What stats() shows of the trial: the side of this step while trying; then the one
        kept, each side's median step seconds, each alternative's median turn ratio and the
        steps counted."""
        if self.winner is None:
            return {"route_trial": self.arm(step)}
        return {
            "route_trial": self.winner,
            "route_trial_seconds": {side: statistics.median(s) for side, s in self.seconds.items()},
            "route_trial_ratios": {side: self.ratio(side) for side in self.alternatives},
            "route_trial_steps": len(self.sides) * len(self.seconds[MODEL]),
        }


@dataclass(frozen=True)
class SparDLLayout:
    """SparDL's blocks (Zhao et al. 2023): the tensor split into one contiguous block per rank,
    rank b owning block b, and at most `per_rank` pairs sent to each owner and kept by it."""

    numel: int
    ranks: int
    block: int
    per_rank: int

    @classmethod
    def of(cls, numel, k, ranks):
        return cls(numel, ranks, -(-numel // ranks), max(1, -(-k // ranks)))

    def bounds(self):
        """The first index of each block and the end: ranks + 1 int32-safe offsets."""
        return [min(b * self.block, MAX_INDEXED_NUMEL) for b in range(self.ranks + 1)]

    def owned(self, rank):
        """(first index, size) of the block `rank` owns."""
        low = rank * self.block
        return low, max(0, min(self.block, self.numel - low))

    def most_rows(self):
        """The wire rows of a send to an owner, or of its reduced block, at most: per_rank
        elements and the block's marker rows (sparsecomm.core.wire)."""
        return self.per_rank + max(buckets(*self.owned(b)) for b in range(self.ranks))
