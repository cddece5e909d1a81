"""What a compressor of either framework is made of, framework-free: its method (the rules
of sparsecomm.core.methods), its per-layer policy and its planner (sparsecomm.core.plan).

The torch and TF compressors inherit Settings and add only their framework: binding to the
model's parameters, state tensors, kernels and collectives (Settings' abstract methods). Each
method's compressor class declares its hooks (sparsecomm/<framework>/compression.py), both
returning a sparsecomm.core.exchange.Packed:
    pack(tensor, state, density)  the method's kernels -> what the exchange sends
    pack_many(tensors, states, density)  the same of several tensors (default: pack each)
    dense_payload(tensor, state)  what a tensor routed dense sends (default: itself)
"""

import abc

from . import agreement, arguments, report
from .exchange import Packed
from .plan import Planner, Policy

KEPT_DECISION = "(exchange='auto')"  # the kept route decision's key in the shared state (no tensor's name)


class Hooks(abc.ABC):
    """What the core asks of a compressor class: the hooks a method's class declares and what an
    adapter provides (docs/contributing.md, "The seams"). A class that leaves an abstract one
    out cannot be instantiated."""

    # -- a method's class ---------------------------------------------------------------------------

    @abc.abstractmethod
    def pack(self, tensor, state, density: float) -> Packed:
        """The method's pack of a gradient at `density`, with error feedback: what the exchange sends."""

    def pack_many(self, tensors, states, density: float) -> list:
        """The method's packs of several gradients at one density (a DDP bucket's): each one's pack.
        A class whose kernels batch writes its rule here instead, and packs a tensor as a bucket of one."""
        return [self.pack(tensor, state, density) for tensor, state in zip(tensors, states)]

    def dense_payload(self, tensor, state) -> Packed:
        """What a gradient routed dense sends: itself (DGC: its momentum)."""
        return Packed(tensor)

    # -- an adapter (sparsecomm.torch.compression, sparsecomm.tensorflow.compression) --------------

    @abc.abstractmethod
    def _ranks(self) -> int:
        """The number of ranks of the compressor's process set (1 before Horovod starts)."""

    @abc.abstractmethod
    def _allgather_ints(self, ints, name) -> list:
        """Every rank's `ints`, concatenated in rank order: one collective named `name`."""

    @abc.abstractmethod
    def _measure_network(self, device):
        """On `device` (the adapter's, where the gradients are; None where it needs none):
        (Network, LocalCost or None, {tensor: backward window} or None, cost.Hosts or None[,
        the last watched step's seconds]), averaged over the ranks."""

    def _host_layout(self):
        """(hosts, ranks per host) where the hosts' process sets are registered, else None
        (collective; only adapters that try routes on hosts override it)."""
        return None

    def _mean_over_ranks(self, values, name) -> list:
        """`values` averaged over the ranks (only adapters that time the route trial call it)."""
        raise NotImplementedError(f"{type(self).__name__} does not try its routes")

    @abc.abstractmethod
    def _shared_state(self) -> dict:
        """{tensor name: {"step": step}} of every tensor this compressor is bound to."""

    @abc.abstractmethod
    def _adopt_shared_state(self, shared: dict):
        """Takes another rank's _shared_state()."""


class Settings(Hooks):
    """The settings part of a compressor: `method` (the method's settings: ``compressor.method.seed``),
    `policy` (``compressor.policy.min_numel``) and `planner` (routes; ``compressor.planner.network``),
    and the cross-rank agreement check. An adapter provides the abstract methods of Hooks, and its
    method classes name their `method_type`: their constructor's signature and the "Args:" of
    their docstring are core/arguments.py's."""

    method_type = None  # the core Method a compressor class runs (core/methods.py)
    framework = None  # the adapter's: "torch" or "tensorflow"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if vars(cls).get("method_type") is not None:
            cls.__signature__ = arguments.signature(cls.method_type.__name__, cls.framework)
            cls.__doc__ = arguments.documented(cls.__doc__, cls.method_type.__name__, cls.framework)

    def __init__(self, method, min_numel=1024, dense_1d=True, dense=(), process_set=None, **exchange):
        """`method`: a core Method; the policy's arguments; Horovod's process set the compressor runs
        over (None: every rank); exchange=, network=, dense_fallback= of the per-rank-coordinate
        methods (arguments.Given sorts a constructor call into these)."""
        self.method = method
        self.policy = Policy.checked(method.owner, min_numel, dense_1d, dense)
        self.planner = Planner(method.owner, method, self.policy, **exchange)
        self._instance = report.next_instance(process_set)  # names the settings check (same on every rank)
        self._world = None  # the number of ranks the settings were checked for (None: check at the next compress)
        self._reset_seen = False  # an elastic reset happened since the last check: adopt rank 0's shared state

    def settings(self) -> str:
        """The settings every rank must share, as text (compared across ranks on the first step)."""
        fields = dict(self.method.settings(), **self.planner.settings(), **vars(self.policy))
        return report.settings_text(self.method.owner, fields)

    def _check_world(self):
        """On the first compress, and whenever the ranks or shared state may have diverged (an
        elastic reset, a new number of ranks, load_state_dict): every rank's settings and shared
        state compared in one collective (core.agreement). Different settings raise everywhere; a
        different shared state is adopted from rank 0 after a reset, and raises otherwise. Returns
        the number of ranks (read once per compress: a process set's size is a few calls)."""
        ranks = self._ranks()
        if ranks == self._world:
            return ranks
        if self._world is not None:  # the ranks changed under us: an elastic reset we were not told of
            self._reset_seen = True
            self.planner.forget_measurement()
        if ranks > 1:
            name = f"sparsecomm.agreement.{self._instance}"
            auto = self.planner.auto
            shared = self._shared_state()
            if auto is not None and auto.kept is not None:  # a kept route decision: the same on every rank
                shared[KEPT_DECISION] = auto.kept
            adopted = agreement.check(
                self.method.owner,
                self.settings(),
                shared,
                self._reset_seen,
                lambda ints, part: self._allgather_ints(ints, f"{name}.{part}"),
            )
            if adopted is not None:
                if auto is not None:
                    auto.kept = adopted.pop(KEPT_DECISION, None)
                self._adopt_shared_state(adopted)
        self._world, self._reset_seen = ranks, False  # (after the check: one that raised runs again)
        return ranks

    def _forget_world(self):
        """After an elastic reset: the next compress checks the settings and shared state (adopting
        rank 0's) and measures again, collectively, with every rank of the new world."""
        self._world, self._reset_seen = None, True
        self.planner.forget_measurement()

    def _check_state_again(self):
        """After this rank's state was loaded: the next compress compares it with the other ranks'
        (a difference raises: nothing tells which rank is right)."""
        self._world = None

    def _prepare_routing(self, ranks, measure, device=None):
        """The number of ranks to route for, of the `ranks` there are now. exchange="auto" on
        several ranks needs the network and the local cost of the sparse path on `device`
        (`_measure_network`): measured here, once and collectively, when `measure`; a predicate
        (measure=False) starts nothing and routes as on one rank (policy and dense fallback only).
        While the planner watches the backward, auto routes by plan.watch_route and measures at
        the first compress after the watched steps. A kept decision (a restart of the same shape)
        replaces all that."""
        planner, auto = self.planner, self.planner.auto
        if measure and planner.needs_network(ranks) and auto.kept is not None:
            planner.adopt_kept_decision(ranks, self._host_layout)
        if planner.needs_network(ranks):
            if not measure:
                return 1
            if not auto.watching():
                planner.use_measurement(*self._measure_network(device))
        if measure and auto is not None and auto.round_ended():  # every rank decides alike, on the same step times
            auto.add_trial_round(self._mean_over_ranks(auto.trial.round_seconds(auto.steps), "route_trial"))
        return ranks

    def density(self, step: int) -> float:
        """The density at a tensor's step (the warm-up schedule, then ratio)."""
        return self.method.density(step)

    @property
    def ratio(self) -> float:
        """The fraction of each tensor sent per step (DGC: after its warm-up)."""
        return self.method.ratio

    @property
    def exchange(self):
        """The per-rank-coordinate methods' exchange ("auto", "allgather", "spardl", "hierarchical"), else None."""
        return None if self.planner.shared else self.planner.exchange
