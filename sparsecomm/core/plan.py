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
(PyTorch's) first lets the planner watch the backward pass (`watch_backward`): auto routes its
tensors by WATCH_ROUTE (watch_route) for OBSERVED_STEPS steps while it records when each gradient is handed
over and how long the last step took, and then chooses with the overlap of each exchange and
the backward (cost.hidden_times). It then tries its choice on the training against the sides
that could beat it (sparsecomm.core.trial). A decision can be saved with the compressor's
state and kept by a restarted job of the same shape (`decision`, `keep_decision`).
"""

import fnmatch
from dataclasses import dataclass

from . import cost, validate
from .selection import selected_count
from .trial import (
    ALL_DENSE,
    ALL_WATCHED,
    MIX_MARGIN,
    MODEL,
    TRIAL_STEPS,
    WATCH_ROUTE,
    WATCHED,
    RouteTrial,
    StepClock,
    every_tensor,
    route_of,
    sides_to_try,
)
from .wire import MAX_INDEXED_NUMEL, buckets, rows_bytes

SAVED_KEY = "exchange_auto"  # auto's decision in a compressor's state_dict

# Steps auto watches (routing its tensors by WATCH_ROUTE) before it measures: the first step is
# slower than the rest (first allocations, Horovod's first negotiation of each tensor), so the
# last one's windows and step time count.
OBSERVED_STEPS = 2


def first_counted_step(hosts=False):
    """The first step auto's route trial times at the latest, where it watches (0-based): after the
    watch, the measuring step (the model's routes) and one uncounted step for each further sparse
    route it tries (SparDL, and hierarchical's where the hosts were measured)."""
    further = [route for route in cost.SPARSE if route != WATCH_ROUTE and (hosts or route != cost.HIERARCHICAL)]
    return OBSERVED_STEPS + 1 + len(further)


# The most steps before auto's routes are final where it watches: the watch, the measuring step
# and the trial (a benchmark warms up this long before it times auto).
SETTLING_STEPS = first_counted_step(hosts=True) + TRIAL_STEPS


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


def watch_route(method, numel, k, element_size, ranks):
    """How auto sends a tensor while it watches, before the network is measured: by WATCH_ROUTE
    where one rank receives fewer bytes than by dense (so no job starts with dense steps on a
    slow link), else dense (DGC's first warm-up stages on many ranks)."""
    value_size = method.value_bytes(element_size)
    fewer = cost.received_bytes(WATCH_ROUTE, numel, k, element_size, value_size, ranks) < cost.received_bytes(
        "dense", numel, k, element_size, value_size, ranks
    )
    return WATCH_ROUTE if fewer else "dense"


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
        self.epoch = (
            0  # moves whenever final routes are dropped: a bucket's kept routes (core.bucket) stand while it does not
        )

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
        self._drop_final_routes()

    def use_measurement(self, network, local, windows=None, hosts=None, watched_step=None):
        """What the adapter measured for auto (AutoRouter.use_measurement); routes are chosen anew."""
        self.auto.use_measurement(network, local, windows, hosts, watched_step)
        self._drop_final_routes()

    def saved_decision(self):
        """{SAVED_KEY: auto's decision} for a checkpoint ({} without exchange="auto")."""
        if self.auto is None:
            return {}
        return {SAVED_KEY: self.auto.decision() or self.auto.kept}

    def keep_decision(self, saved):
        """A checkpoint's decision (saved_decision), adopted at the next measurement where the
        world has the same shape (AutoRouter.adopt_kept)."""
        kept = saved.get(SAVED_KEY) if isinstance(saved, dict) else None
        if self.auto is not None and kept is not None:
            self.auto.kept = kept

    def adopt_kept_decision(self, ranks, host_layout):
        """Where auto holds a kept decision (AutoRouter.adopt_kept): routes are chosen anew."""
        self.auto.adopt_kept(ranks, host_layout)
        self._drop_final_routes()

    def _drop_final_routes(self):
        self._final.clear()
        self.epoch += 1

    def routes_final(self):
        """Whether a route decided now stands for the same inputs (not while auto watches or tries)."""
        return self.auto is None or self.auto.routes_final()

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
        if record and self.routes_final():
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
            route = watch_route(self.method, numel, k, element_size, ranks)
            return self._record(name, record, {"exchange": route, "watching_backward": True})
        return self._record(name, record, auto.choose(name, numel, k, element_size, ranks))

    def _record(self, name, record, chosen):
        if record:
            self.choices[name] = chosen
        return chosen["exchange"]


class AutoRouter:
    """exchange="auto": the cost model's route on the network the adapter measured, after watching
    the backward (where the adapter can time Horovod's hooks), then tried on the training against
    the sides that could beat it (RouteTrial). Starts nothing: the adapter measures and hands
    results in."""

    def __init__(self, method, network=None):
        self.method, self.network = method, network
        self.local = None  # cost.LocalCost of the compressor's sparse path, measured with the network
        self._network_measured = False  # the network was measured here (not the user's): measured again on a new world
        self._cached = {}  # name -> ((k, ranks, side), chosen)
        self.backward = None  # BackwardWindows while auto watches the backward (watch_backward)
        self.available = (*cost.EXCHANGES, cost.HIERARCHICAL)  # the routes the way in provides (DDP: fewer)
        self.hosts = None  # cost.Hosts, measured where the hosts' process sets are registered: hierarchical runs
        self._windows = {}  # name -> seconds of backward after its hand-off, averaged over the ranks
        self._watched_step = None  # seconds of the last watched step, averaged over the ranks
        self._hidden = None  # name -> hidden seconds of its exchange (cost.hidden_times), once computed
        self._shapes = {}  # name -> (numel, element size, density, routed by auto) while watched: hidden_times' queue
        self._watches = False  # watch_backward was called: a new world watches again
        self.steps = None  # StepClock while auto watches and tries its routes (watch_backward)
        self.trial = None  # RouteTrial, once auto chose after watching
        self._trial_ranks = None  # the ranks the trial ran on (a kept decision's world)
        self.kept = None  # a decision kept across a restart (decision()), adopted where the world is alike

    def needs_network(self, ranks):
        return self.network is None and ranks > 1

    def watch_backward(self):
        """Called by an adapter that times Horovod's hooks: where auto will measure the network,
        it first watches OBSERVED_STEPS steps of the backward pass (routing by WATCH_ROUTE)."""
        if self.network is None:
            self.backward, self.steps, self._watches = BackwardWindows(), StepClock(), True

    def limit_to(self, exchanges):
        """For a way in that neither times the hooks nor carries every exchange (the DDP hook):
        no watch and no route trial, and the cost model chooses among `exchanges` only."""
        self.backward, self.steps, self.available, self._watches = None, None, exchanges, False

    def watching(self):
        """Whether auto is still watching the backward: measure the network only after it."""
        return self.backward is not None and not self.backward.complete()

    def watched_step(self):
        """The seconds of the last watched step (this rank's), for the adapter to average."""
        return self.steps.last_step_seconds() if self.steps is not None else None

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

    def use_measurement(self, network, local, windows=None, hosts=None, watched_step=None):
        """The network and local cost measured by the adapter, where it watched the backward each
        tensor's window and the last watched step's seconds averaged over the ranks, and where the
        hosts' process sets are registered the hosts (cost.Hosts, with their link measured):
        `network` is then a host's NIC."""
        self.network, self.local, self.hosts, self._network_measured = network, local, hosts, True
        self._windows, self._hidden, self._watched_step = dict(windows or {}), None, watched_step
        self._cached.clear()

    def forget_measurement(self):
        """Drops a measured network (not one the user gave) and every route chosen with it; a
        decided trial is kept (`kept`) for a world of the same shape."""
        if self.kept is None:
            self.kept = self.decision()
        if self._network_measured:
            self.network, self.local, self.hosts, self._network_measured = None, None, None, False
            self._windows, self._hidden, self._watched_step = {}, None, None
        if self._watches:
            self.backward, self.steps = BackwardWindows(), StepClock()
        self.trial = None
        self._cached.clear()

    def decision(self):
        """What a restarted job needs to route as this one decided (KeptDecision.saved), once
        the trial decided; else None."""
        if self.trial is None or self.trial.winner is None or not self._network_measured:
            return None
        return KeptDecision.of(self, self._trial_ranks).saved()

    def adopt_kept(self, ranks, host_layout):
        """Routes by the kept decision where it was made on `ranks` ranks and, where it had hosts,
        on hosts of the same layout (`host_layout()`, collective, called only then): nothing is
        watched, measured or tried. Otherwise it is dropped and auto starts afresh."""
        kept, self.kept = KeptDecision.loaded(self.kept), None
        if kept.ranks == ranks and (kept.hosts is None or host_layout() == kept.layout()):
            self.use_measurement(kept.network, kept.local, hosts=kept.hosts)
            self._hidden, self.backward, self._trial_ranks = dict(kept.hidden), None, ranks
            self.trial = RouteTrial.decided(kept.winner)

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
            self._hidden = self._costs(ranks).hidden_times(self._shapes, self._windows)
        if self.trial is None and self.steps is not None:
            sides = self._costs(ranks).trial_sides(self._shapes, self._windows, self._hidden, self._watched_step)
            self.trial, self._trial_ranks = RouteTrial(self.steps.step, *sides), ranks
        side = MODEL if self.trial is None else self.trial.arm(self.steps.step)
        cached = self._cached.get(name)
        if cached is None or cached[0] != (k, ranks, side):
            cached = self._cached[name] = ((k, ranks, side), self._chosen(name, numel, k, element_size, ranks, side))
        return cached[1]

    def _chosen(self, name, numel, k, element_size, ranks, side):
        hidden = self._hidden.get(name, 0.0)
        choice, predicted = self._costs(ranks).choice(numel, k, element_size, hidden)
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

    def _costs(self, ranks):
        return RouteCosts(self.method, self._routes(), self.network, self.local, self.hosts, ranks)


class RouteCosts:
    """The cost model's figures for auto on a measured network and `ranks` ranks: a tensor's
    route by the model or by a trial's side, the hidden time of each watched tensor's exchange
    in the link's queue, and what a routing adds to a step. `shapes`: name -> (numel, element
    size, density, routed by auto), as watched; `windows`: name -> backward window seconds."""

    def __init__(self, method, routes, network, local, hosts, ranks):
        self.method, self.routes, self.network, self.local, self.hosts = method, routes, network, local, hosts
        self.ranks = ranks

    def choice(self, numel, k, element_size, hidden):
        """cost.choose for this method: (route, every prediction)."""
        size = self.method.value_bytes(element_size)
        args = (self.ranks, self.network, self.routes, self.local, hidden, self.hosts)
        return cost.choose(numel, k, element_size, size, *args)

    def parts(self, shape):
        """(local, wire) seconds of each route for a watched tensor's shape."""
        numel, size, density, _ = shape
        k, value_size = selected_count(density, numel), self.method.value_bytes(size)
        return cost.local_and_wire(numel, k, size, value_size, self.ranks, self.network, self.local, self.hosts)

    def route(self, shape, side, hidden):
        """A watched tensor's route under `side` (dense where the settings send it dense)."""
        numel, size, density, by_auto = shape
        k = selected_count(density, numel)
        if not by_auto:
            return "dense"
        if side == WATCHED:
            return watch_route(self.method, numel, k, size, self.ranks)
        return self.choice(numel, k, size, hidden)[0] if side == MODEL else route_of(side)

    def hidden_times(self, shapes, windows, side=MODEL):
        """cost.hidden_times over the watched tensors: each occupies the link for the wire time of
        its route under `side` at its density in the last watched step."""
        watched = [(name, window) for name, window in windows.items() if name in shapes]
        return cost.hidden_times(
            watched, lambda name, h: self.parts(shapes[name])[self.route(shapes[name], side, h)][1]
        )

    def exposed_seconds(self, shapes, windows, side):
        """Seconds the watched tensors' exchanges add to a step routed by `side`: each one's local
        work and the wire time its backward window does not hide."""
        hidden, exposed = self.hidden_times(shapes, windows, side), 0.0
        for name, shape in shapes.items():
            work, wire = self.parts(shape)[self.route(shape, side, hidden.get(name, 0.0))]
            exposed += work + max(0.0, wire - hidden.get(name, 0.0))
        return exposed

    def trial_sides(self, shapes, windows, hidden, watched_step):
        """(alternatives, warming, predicted ratios[, the model's side's route]) of a RouteTrial:
        every tensor by each route, sparse first, but the model's own where it sends every
        watched tensor one way, and only the sides that could win (trial.sides_to_try). A mix not
        predicted MIX_MARGIN faster than the watch's route runs as that route (a mix can be
        slower than any of them). With no watched tensor for auto: all dense, warmed by the
        model's routes. `hidden`: the model's hidden seconds; `watched_step`: the watched step's."""
        chosen = {self.route(shape, MODEL, hidden.get(name, 0.0)) for name, shape in shapes.items() if shape[3]}
        if not chosen:
            return (ALL_DENSE,), (MODEL,), {}
        own = every_tensor(chosen.pop()) if len(chosen) == 1 else None
        sparse = [every_tensor(route) for route in self.routes if route != "dense"]
        candidates = [side for side in (*sparse, ALL_DENSE) if side != own]
        predicted = self.predicted_steps((MODEL, *candidates), shapes, windows, watched_step)
        if (
            own is None
            and predicted
            and ALL_WATCHED in predicted
            and predicted[ALL_WATCHED] <= (1 + MIX_MARGIN) * predicted[MODEL]
        ):
            candidates.remove(ALL_WATCHED)  # the mix is not predicted enough faster: the model's side routes so
            predicted[MODEL] = predicted.pop(ALL_WATCHED)
            return (*sides_to_try(candidates, predicted), WATCH_ROUTE)
        return sides_to_try(candidates, predicted)

    def predicted_steps(self, sides, shapes, windows, watched_step):
        """side -> the step the model predicts for it: the watched step, less what the model
        predicts the watched routing (WATCHED) added to it, plus what it predicts `side`
        adds. None where the model predicts the watched routing slower than the whole step it
        timed (or nothing was timed): its figures are wrong, and every side is tried."""
        added = {side: self.exposed_seconds(shapes, windows, side) for side in {*sides, WATCHED}}
        if watched_step is None or added[WATCHED] >= watched_step:
            return None
        return {side: watched_step - added[WATCHED] + added[side] for side in sides}


@dataclass(frozen=True)
class KeptDecision:
    """auto's decision as a checkpoint holds it (plain numbers and names: it also travels in the
    ranks' agreement check, sparsecomm.core.agreement): the world it was made on, the measurement,
    each tensor's hidden seconds and the side the trial kept."""

    ranks: int
    network: cost.Network
    local: object  # cost.LocalCost or None
    hosts: object  # cost.Hosts or None
    hidden: dict
    winner: str

    @classmethod
    def of(cls, auto, ranks):
        return cls(ranks, auto.network, auto.local, auto.hosts, dict(auto._hidden or {}), auto.trial.winner)

    def layout(self):
        return (self.hosts.count, self.hosts.per_host)

    def saved(self):
        def numbers(network):
            return [network.bandwidth, network.latency, network.copy_bandwidth]

        local = self.local and [self.local.per_call, self.local.per_element, self.local.per_pair]
        hosts = self.hosts and [*self.layout(), *numbers(self.hosts.link)]
        return dict(
            ranks=self.ranks,
            network=numbers(self.network),
            local=local,
            hosts=hosts,
            hidden=self.hidden,
            winner=self.winner,
        )

    @classmethod
    def loaded(cls, saved):
        hosts = saved["hosts"] and cost.Hosts(*saved["hosts"][:2], cost.Network(*saved["hosts"][2:]))
        local = saved["local"] and cost.LocalCost(*saved["local"])
        return cls(
            int(saved["ranks"]), cost.Network(*saved["network"]), local, hosts, dict(saved["hidden"]), saved["winner"]
        )


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
