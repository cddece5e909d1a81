"""Horovod's hooks of a torch compressor (compress, decompress), with tensors prepared in groups.

hvd.DistributedOptimizer hands the compressor one gradient at a time, in the order its backward
pass makes them, or a Horovod group's (groups=, num_groups=) one after another. A tensor on a
per-rank-coordinate route (allgather, spardl, hierarchical) need not be packed at once: compress
hands Horovod the placeholder those exchanges hand it anyway, and the tensor waits for
its group. A group is a run, of at most GROUP_BYTES (DDP's default bucket), of the order in which
the last step handed its tensors over; when its last tensor arrives, the waiting ones are prepared
as one bucket (sparsecomm.torch.bucket: one pack op, one host read on a GPU) and their exchanges
start. A tensor that arrives out of that order, and the first decompress of a step, start every
tensor still waiting first: nothing waits past its step. Horovod matches collectives by name, so
the groups need not be alike on every rank. Tensors go one by one while auto watches or tries its
routes (it times each one) and under a loss scaler (its rollback may change a tensor's route).
The placeholders of the step of a settings check (the first, and the first after an elastic
reset or load_state_dict) are core.placement's markers, checked in decompress (one host read
each, on that step only): the optimizer's process set must be the compressor's."""

import time

import torch

from ..core import placement
from . import exchange
from .bucket import Bucket

GROUP_BYTES = 25 * 2**20
SPARSE_ROUTES = ("allgather", "spardl", "hierarchical")  # the exchanges that hand Horovod a placeholder


class Deferred:
    """decompress's context of a tensor waiting for its group: its route and routing at compress,
    and its exchange's context once started."""

    __slots__ = ("tensor", "state", "route", "routing", "ctx")

    def __init__(self, tensor, state, route, routing):
        self.tensor, self.state, self.route, self.routing, self.ctx = tensor, state, route, routing, None


class Marked:
    """decompress's context of the placeholder handed as the marker of core.placement."""

    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner


class Grouping:
    """One compressor's groups: this step's order so far, the last step's (each tensor's successor,
    and the tensors that end a group), and the tensors waiting."""

    def __init__(self):
        self.order = []  # (name, bytes) of this step's compresses, in order
        self.waiting = []  # [Deferred], in the order they came
        self._next = {}  # name -> the name after it in the last step's order
        self._closing = set()  # the names that end a group of the last step's order

    def ready(self):
        """Whether a tensor may wait: a last step's order exists to group by."""
        return bool(self._closing)

    def arrive(self, start, name, nbytes, deferred=None):
        """A compress of this step (`deferred`: it waits for its group; None: it went at once). A
        tensor the last step's order does not put after the one before it, and the last of a
        group, start the tensors waiting (`start(waiting)`)."""
        if self.waiting and not (self.order and self._next.get(self.order[-1][0]) == name):
            self._start(start)
        self.order.append((name, nbytes))
        if deferred is not None:
            self.waiting.append(deferred)
        if name in self._closing and self.waiting:
            self._start(start)

    def end_step(self, start):
        """The step's first decompress: every tensor still waiting starts, and the step's order
        makes the next step's groups."""
        if self.waiting:
            self._start(start)
        if self.order:
            order, self.order = self.order, []
            self._next = {a: b for (a, _), (b, _) in zip(order, order[1:])}
            self._closing, size = set(), 0
            for i, (name, nbytes) in enumerate(order):
                size += nbytes
                if i == len(order) - 1 or size + order[i + 1][1] > GROUP_BYTES:
                    self._closing.add(name)
                    size = 0

    def _start(self, start):
        waiting, self.waiting = self.waiting, []
        start(waiting)


class HorovodHooks:
    """compress and decompress, over the Compressor's template (prepare, the Bucket of a group,
    the exchanges in flight) and its Grouping (`_grouping`)."""

    def compress(self, tensor: torch.Tensor):
        """Horovod's hook: (what to allreduce, context for decompress)."""
        started = time.perf_counter()
        if self.planner.timing_steps():
            self.planner.auto.steps.note_compress()
        state = self.state.for_gradient(tensor)
        nbytes, routing = tensor.numel() * tensor.element_size(), None
        if self._may_wait():
            routing = self.routing(tensor.device)
            route = self._route_now(tensor, state, routing)
            if route in SPARSE_ROUTES:
                deferred = Deferred(tensor, state, route, routing)
                self._grouping.arrive(self._start_group, state.name, nbytes, deferred)
                return self._marked(torch.ones(1, dtype=torch.float32, device=tensor.device), deferred)
        state, route, payload, k, ranks = self.prepare(tensor, state, routing)
        handed, ctx, traffic = self._in_flight.start(
            route, payload, tensor, state, k, self.collectives.process_set(), ranks
        )
        self.state.counters.account(state.name, tensor.numel(), nbytes, *traffic, time.perf_counter() - started)
        if self.planner.watching():
            self.planner.auto.backward.note_handoff(state.name, time.perf_counter())
        self._grouping.arrive(self._start_group, state.name, nbytes)
        return self._marked(handed, ctx) if route in SPARSE_ROUTES else (handed, ctx)

    def decompress(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        """Horovod's hook: the dense gradient from what the allreduce returned."""
        self._grouping.end_step(self._start_group)
        self._marking, reduced_marker = False, None
        if isinstance(ctx, Marked):
            reduced_marker, tensor, ctx = tensor.tolist(), tensor[:1], ctx.inner  # (a host read, on a check's step)
        if isinstance(ctx, Deferred):
            ctx = ctx.ctx
        if self.planner.watching():
            self.planner.auto.backward.note_decompress()
        result = self._in_flight.finish(tensor, ctx, self.state.counters.account_later)
        if self.planner.timing_steps():  # after the unpack, and the wait for a gather inside it
            self.planner.auto.steps.note_decompress(time.perf_counter())
        if reduced_marker is not None:  # (after the exchange's phases, which every rank runs)
            placement.check(self.method.owner, reduced_marker, self.collectives.process_set().ranks, self.process_set)
        return result

    def _marked(self, placeholder, ctx):
        """A placeholder of the step of a settings check (until its first decompress) becomes
        core.placement's marker: every rank checks at the same compress, so all hand markers."""
        if not self._marking:  # every tensor but those of a settings check's step
            return placeholder, ctx
        hvd = exchange.horovod()
        if not hvd.is_initialized():
            return placeholder, ctx
        mark = placement.marker(hvd.rank(), self.collectives.process_set().ranks)
        return torch.tensor(mark, dtype=torch.float32, device=placeholder.device), Marked(ctx)

    def _may_wait(self):
        """Whether a tensor may wait for its group: an order to group by, routes that stand, no loss
        scaler, and auto not timing the steps."""
        planner = self.planner
        if not self._grouping.ready() or self.loss_scaling is not None or not planner.routes_final():
            return False
        return not (planner.timing_steps() or planner.watching())

    def _route_now(self, tensor, state, routing):
        """The tensor's route at its step (as its Bucket will decide it), its shape checked first."""
        shape = (state.name, tensor.numel(), tensor.dim(), tensor.element_size())
        self.planner.check_indexable(*shape)
        return self.planner.route(*shape, self.method.density(state.step), routing[1])

    def _start_group(self, waiting):
        """The waiting tensors prepared as one bucket (kept by their names), their exchanges started."""
        started = time.perf_counter()
        tensors, states = [w.tensor for w in waiting], [w.state for w in waiting]
        key = tuple(state.name for state in states)
        bucket = self._buckets.get(key)
        if bucket is None or any(a is not b for a, b in zip(bucket.states, states)):
            bucket = self._buckets[key] = Bucket(self, states, tensors)
        with self.packs.deferred():  # (one pack op for the group)
            routes, payloads = bucket.prepare(self, tensors, waiting[0].routing)
        process_set, ranks, traffic = self.collectives.process_set(), waiting[0].routing[0], []
        for w, route, payload, k in zip(waiting, routes.routes, payloads, routes.ks):
            if route != w.route:
                raise RuntimeError(f"sparsecomm: {w.state.name!r} was routed {w.route!r} at compress, then {route!r}")
            _, w.ctx, moved = self._in_flight.start(route, payload, w.tensor, w.state, k, process_set, ranks)
            traffic.append(moved)
        self.state.counters.account_bucket(id(bucket), bucket.stats_rows(traffic), time.perf_counter() - started)
