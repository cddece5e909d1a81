"""Horovod compressors for PyTorch.

Every compressor is an instance usable as ``hvd.DistributedOptimizer(...,
compression=...)``: Horovod calls ``compress(tensor) -> (tensor, ctx)`` on each gradient,
allreduces (sums, then scales for Average) what it returns, and sets the parameter's
gradient to ``decompress(output, ctx)``.

The methods' rules are sparsecomm.core's (written once for torch and TF); this module binds
them to parameters, keeps per-parameter state and runs the kernels (ops) and the exchanges
(exchange.EXCHANGES). A compressor class declares its core method (`Method`) and its
`pack` hook; DGC also overrides `dense_payload`.
"""

import copy

import torch

from ..core import arguments, methods
from ..core.compressor import Settings
from ..core.exchange import Packed
from ..core.selection import selected_count, stream_of, streams_of
from . import calibration, collectives, elastic, exchange, ops
from .bucket import Bucket
from .horovod_hooks import Grouping, HorovodHooks
from .loss_scaling import LossScaling
from .sampled_packs import SampledPacks
from .state import CompressorState, ParameterState


class _OverCollectives:
    """What the core's Settings asks of the ranks, over the compressor's `collectives`: Horovod's
    process set from the start; torch.distributed's group once a hook calls use_collectives."""

    def use_collectives(self, over):
        """Runs the settings check, the network measurement and the route trial over `over` from
        now on (one of sparsecomm.torch.collectives')."""
        self.collectives = over

    def _ranks(self) -> int:
        return self.collectives.size()

    def _allgather_ints(self, ints, name):
        return self.collectives.allgather_ints(ints, name)

    def _host_layout(self):
        return self.collectives.host_layout()

    def _mean_over_ranks(self, values, name):
        return self.collectives.mean_over_ranks(values, f"sparsecomm.{name}.{self._instance}")


class Compressor(HorovodHooks, _OverCollectives, Settings):
    """The compress/decompress template every compressor shares: state -> route (policy, dense
    fallback, exchange) -> pack -> count the step -> exchange -> account. Hooks (declared by the
    core's Settings): ``pack(tensor, state, density) -> Packed`` (required),
    ``dense_payload(tensor, state) -> Packed`` (default: the gradient itself).
    Each method's arguments and their docs are sparsecomm.core.arguments', as its class's
    docstring shows."""

    framework = "torch"

    def __init__(self, *args, **kwargs):
        given = arguments.Given(type(self).__name__, self.method_type, self.framework, args, kwargs)
        super().__init__(given.method, process_set=given.process_set, **given.settings)
        self._name = self.method.owner
        self.process_set = given.process_set  # the optimizer's (None: all ranks); the agreement check runs over it
        self.collectives = collectives.Horovod(self.process_set)  # a hook's: use_collectives
        self.loss_scaling = LossScaling.of(self._name, given.loss_scaler)  # None: gradients are not loss-scaled
        self.state = CompressorState(self._name, given.binding)
        self.packs = SampledPacks()  # the sampled packs, run one tensor or one DDP bucket at a time
        self._buckets = {}  # a bucket's key (its parameters', or a tensor's name and shape) -> Bucket
        self._in_flight = exchange.InFlight()
        self._grouping = Grouping()  # Horovod's tensors prepared in groups (HorovodHooks)
        self._marking = False  # this step's placeholders are core.placement's markers (HorovodHooks)
        if self.planner.auto is not None:  # auto first times the hooks: how much of each exchange the backward hides
            self.planner.auto.watch_backward()
        elastic.register_handlers(Compressor)

    def routing(self, device: torch.device):
        """(ranks, the ranks to route for) of the next gradients on `device`: the settings check
        and auto's measurement where they are due. Once a tensor (Horovod) or a bucket (DDP)."""
        world = self._world
        ranks = self._check_world()
        self._marking |= ranks != world  # a check: every rank's at the same compress (core.placement)
        return ranks, self._prepare_routing(ranks, measure=True, device=device)

    def prepare(self, tensor: torch.Tensor, state: ParameterState, routing=None):
        """What both ways in do before an exchange, for one tensor: the settings check, the route,
        the method's pack (or the dense payload) and the step (a bucket of one: prepare_bucket).
        `routing`: routing()'s, where the caller made it. Returns (state, route, payload, k, ranks)."""
        key = (state.name, tensor.numel(), tensor.dim(), tensor.element_size())
        bucket = self._buckets.get(key)
        if bucket is None or bucket.states[0] is not state:  # (its shape checked before any collective)
            bucket = self._buckets[key] = Bucket(self, [state], [tensor])
        routing = routing or self.routing(tensor.device)
        routes, payloads = bucket.prepare(self, [tensor], routing)
        return state, routes.routes[0], payloads[0], routes.ks[0], routing[0]

    def bucket_of(self, params, tensors) -> Bucket:
        """The Bucket of a hook's parameters and their gradients (made on first use: each parameter
        must be bound)."""
        key = tuple(map(id, params))
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(self, [self.state.of_parameter(p) for p in params], tensors)
        return bucket

    def payloads(self, route, tensors, states, density):
        """What gradients on one route at one density send (Packeds): the method's packs (one
        pack_many), the dense payloads, or under a loss scaler each one backed up and packed."""
        if self.loss_scaling is not None:
            return [self.loss_scaling.back_up_and_pack(self, t, s, route, density) for t, s in zip(tensors, states)]
        if route == "dense":
            return [self.dense_payload(tensor, state) for tensor, state in zip(tensors, states)]
        return self.pack_many(tensors, states, density)

    # -- routes, ranks and what the core's Settings asks of an adapter ------------------------------

    def goes_dense(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether this parameter's gradient is sent dense at its current step (starts nothing)."""
        density = self.method.density(self.state.step_of(name))
        ranks = self._prepare_routing(self._ranks(), measure=False)
        return self.planner.route(name, tensor.numel(), tensor.dim(), tensor.element_size(), density, ranks) == "dense"

    def bound_parameters(self):
        """The bound parameters' names, in the order named_parameters gave them."""
        return list(self.state.binding.params)

    def _measure_network(self, device):
        return calibration.measure(self, device)

    def _shared_state(self):
        return self.state.shared()

    def _adopt_shared_state(self, shared):
        self.state.adopt(shared)

    def _residual_of(self, state: ParameterState, tensor: torch.Tensor):
        return state.residual_for(tensor, self.method.keeps_residual)

    # -- checkpoints, elastic Horovod (sparsecomm.torch.elastic) and stats -----------------------

    def state_dict(self) -> dict:
        """This rank's state for checkpoints (each rank its own): per parameter the step, residual,
        momentum and their loss scale (with a loss_scaler: call it after ``scaler.update()``)."""
        if self.loss_scaling is not None:
            self.loss_scaling.settle(self.state.parameters.values())
        return dict(self.state.state_dict(), **self.planner.saved_decision())

    def load_state_dict(self, state: dict) -> None:
        """Restores a state_dict() as if training had not stopped (auto's routes too, on a world of
        the same shape). Load on every rank, each its own: the next compress compares the ranks."""
        self.state.load_state_dict(state)
        self._buckets.clear()  # (they hold the states replaced)
        self.planner.keep_decision(state)
        self._check_state_again()

    def elastic_snapshot(self) -> dict:
        """A copy of state_dict() (hvd.elastic.TorchState's commit)."""
        return copy.deepcopy(self.state_dict())

    def elastic_restore(self, snapshot: dict) -> None:
        """Back to a snapshot (TorchState's restore after a failure; the snapshot is copied, not taken)."""
        self._in_flight.drop()
        self._grouping = Grouping()
        self.load_state_dict(snapshot)

    def elastic_sync(self) -> None:
        """After a reset (no collective here): the next compress adopts rank 0's steps, collectively."""
        self._in_flight.drop()
        self._grouping = Grouping()
        self._forget_world()

    def stats(self) -> dict:
        """Since construction: calls, dense_bytes, sent_bytes, received_bytes, compress_seconds, and
        per parameter under "tensors" the same plus numel, sent_elements, density and the exchange
        chosen (docs/compressors.md, "stats()")."""
        return self.state.counters.stats(self.planner.choices)


class RandomBlock(Compressor):
    """Random-block sparsification with a shared seed (Eghlidi & Jaggi 2020), with error feedback.

    Each step, every rank sends the same cyclic block of ``k = max(1, round(ratio * numel))``
    contiguous elements of (residual + gradient); the block start is a pure function of
    ``(seed, step, parameter name)`` (Philox4x32-10), never of a global RNG. Because all ranks
    pick the same coordinates, the packed values ride Horovod's own allreduce with no indices
    on the wire. What is not sent stays in a per-parameter float32 residual."""

    method_type = methods.RandomBlock

    def pack(self, tensor, state, density):
        numel = tensor.numel()
        start = ops.random_block_start(self.method.seed, state.tensor_id, state.step, numel)
        values = ops.block_pack(tensor, self._residual_of(state, tensor), start, selected_count(density, numel))
        return Packed(values, start=start)


class RandomK(RandomBlock):
    """Random-k sparsification with a shared seed, with error feedback: each step every rank
    sends the same ``k = max(1, round(ratio * numel))`` coordinates, drawn without replacement
    from ``(seed, step, parameter name)`` (a keyed permutation; no global RNG). Shared
    coordinates let the values ride Horovod's allreduce with no indices on the wire."""

    method_type = methods.RandomK

    def pack(self, tensor, state, density):
        values, index = ops.pack_randomk(
            tensor,
            self._residual_of(state, tensor),
            selected_count(density, tensor.numel()),
            seed=self.method.seed,
            **stream_of(state),
        )
        return Packed(values, index)


class _PerRank(Compressor):
    """The per-rank-coordinate methods: ``exchange="allgather"`` (values and 2-byte offsets of
    every rank), ``"spardl"`` (sparse reduce-scatter + all-gather, O(k) bytes per rank whatever
    N), ``"hierarchical"`` or ``"auto"`` (default: the exchange the cost model of
    sparsecomm.core.cost predicts fastest for that tensor, where it is predicted at least 20%
    faster than the dense allreduce, else dense; on ``network`` or on the network measured
    once on the first step). With ``dense_fallback`` (default), a tensor whose sparse
    payload (k wire rows) would not be smaller than the dense tensor goes dense."""


class _Batched:
    """A method whose pack is written over several gradients at one density (pack_many: a DDP
    bucket's in one op): a tensor is a bucket of one."""

    def pack(self, tensor, state, density):
        return self.pack_many([tensor], [state], density)[0]


class TopK(_Batched, _PerRank):
    """Exact top-k sparsification with error feedback: each rank sends the
    ``k = max(1, round(ratio * numel))`` entries of largest magnitude of (residual + gradient).
    Coordinates differ per rank: values and indices travel by the exchange (``exchange``);
    what is not sent stays in a per-parameter float32 residual."""

    method_type = methods.TopK

    def pack_many(self, tensors, states, density):
        ks = [selected_count(density, tensor.numel()) for tensor in tensors]
        residuals = [self._residual_of(state, tensor) for tensor, state in zip(tensors, states)]
        return self.packs.topk_many(tensors, residuals, ks, **streams_of(states))


class RTopK(_PerRank):
    """rTop-k (Barnes et al. 2020), with error feedback: each rank sends ``k`` entries drawn
    uniformly at random from its ``r`` entries of largest magnitude of (residual + gradient),
    ``k = max(1, round(ratio * numel))``, ``r = max(k, round(r * numel))``. Coordinates
    differ per rank: values and indices travel by the exchange."""

    method_type = methods.RTopK

    def pack(self, tensor, state, density):
        numel, method = tensor.numel(), self.method
        args = (self._residual_of(state, tensor), selected_count(method.r, numel), selected_count(density, numel))
        stream = dict(seed=method.seed_of(self.collectives.rank()), **stream_of(state))
        if ops.reads_wait(tensor.device):  # (no read: the top r at fixed capacity, with the bucket's packs)
            return self.packs.rtopk(tensor, *args, **stream)
        return Packed(*ops.pack_rtopk(tensor, *args, **stream))


def _sampled_many(compressor, tensors, states, density, momenta=None, grad_scales=None, **feedback):
    """The sampled-threshold packs of Threshold and DGC (values quantized as the method says), one op
    under DDP (1-/2-bit ones too, at fixed capacity); `feedback`: DGC's momentum settings of
    pack_sampled, with each tensor's momentum and clipping factor."""
    method = compressor.method
    values = dict(value_dtype=method.value_dtype and getattr(torch, method.value_dtype), bits=method.bits)
    residuals = [compressor._residual_of(state, tensor) for tensor, state in zip(tensors, states)]
    nones = [None] * len(tensors)
    return compressor.packs.sampled_many(
        tensors,
        residuals,
        density,
        sample_ratio=method.sample_ratio,
        **streams_of(states),
        momenta=momenta or nones,
        grad_scales=grad_scales or nones,
        **values,
        **feedback,
    )


class Threshold(_Batched, _PerRank):
    """Gradient dropping (Aji & Heafield 2017), with error feedback: each rank sends the entries
    of (residual + gradient) whose magnitude reaches a threshold estimated from a sample, about
    ``ratio`` of each tensor (always within [0.8 k, 1.3 k]); the rest stays in the residual."""

    method_type = methods.Threshold

    def pack_many(self, tensors, states, density):
        return _sampled_many(self, tensors, states, density)


class DGC(_Batched, _PerRank):
    """Deep Gradient Compression (Lin et al. 2017): sampled-threshold sparsification of the
    momentum-corrected accumulation, per parameter and rank:

        g = clip(g, clip_norm / sqrt(N))      (local gradient clipping, optional, per tensor)
        u = momentum * u + g                  (momentum correction: momentum lives here)
        v = v + u;  send the entries of v above the sampled threshold; v[sent] = 0
        u[sent] = 0                           (momentum factor masking, default on)

    Warm-up: for the first ``warmup_steps`` steps (compress calls of a parameter), the density
    rises exponentially over ``warmup_stages`` equal stages, ratio ** ((s + 1) / (stages + 1))
    at stage s: 25%, 6.3%, 1.6%, 0.4%, then 0.1% for ratio 0.001 and 4 stages, as in the paper.

    Pair it with a plain SGD optimizer (``momentum=0``): the momentum is DGC's. A tensor sent
    dense (the per-layer policy, or a density at which sparse would be larger) gets momentum SGD,
    ``u = momentum * u + g`` reduced whole, as the paper's dense layers do. With ratio=1 and
    momentum_masking=False (and dense_fallback=False) it is exactly distributed momentum SGD."""

    method_type = methods.DGC

    def _clip_factor(self, tensor, state):
        """Local gradient clipping to clip_norm / sqrt(N): the factor limit / norm (1 below the
        limit) as a 0-d float32 tensor on the gradient's device (no host read), or None without
        clipping. The kernels read the gradient times it, rounded once to its dtype, in the state's
        own pass: no pass that scales the gradient first. Under a loss scaler the limit is times the
        state's scale, as the gradient is. The norm reads the gradient once, in float64; a DDP
        bucket's factors are one op (SampledPacks.clip_factor)."""
        if self.method.clip_norm is None:  # (before reading the ranks: compress calls this for every tensor)
            return None
        scale = (state.loss_scale or 1.0) if self.loss_scaling is not None else 1.0
        return self.packs.clip_factor(tensor, self.method.clip_limit(self._ranks(), scale))

    def dense_payload(self, tensor, state):
        """Momentum SGD for a gradient sent dense (policy, or sparse would be larger): u = m u + g,
        and u is what is reduced (with Nesterov, u = m (u + g), and u + g), so DGC + plain SGD keeps
        momentum on every tensor."""
        momentum = state.momentum_for(tensor)
        grad = tensor if tensor.is_contiguous() else tensor.contiguous()  # (a strided one: a copy, reduced instead)
        # one pass, u into the gradient that is reduced (with a DDP bucket's others: one op)
        return self.packs.momentum_step(grad, momentum, **self.method.momentum_args(self._clip_factor(tensor, state)))

    def pack_many(self, tensors, states, density):
        momenta = [state.momentum_for(tensor) for tensor, state in zip(tensors, states)]
        scales = [self._clip_factor(tensor, state) for tensor, state in zip(tensors, states)]
        feedback = dict(self.method.momentum_settings(), masking=self.method.momentum_masking)
        return _sampled_many(self, tensors, states, density, momenta, scales, **feedback)
