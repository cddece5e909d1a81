"""Horovod compressors for TensorFlow: the same family, arguments and defaults as
``sparsecomm.torch``, for ``hvd.DistributedGradientTape``, ``hvd.allreduce``,
``horovod.tensorflow.keras.DistributedOptimizer`` (tf-keras) and
``sparsecomm.tensorflow.keras.DistributedOptimizer`` (Keras 3).

Horovod calls ``compress(grad) -> (tensor, ctx)``, allreduces the tensor and returns
``decompress(output, ctx)``, usually inside a tf.function trace: everything here is TF
ops, and the per-variable state lives in TF variables (sparsecomm/tensorflow/state.py).
Compressors are tf.Modules: ``tf.train.Checkpoint(compression=compressor)`` saves
residuals, momenta and steps. The methods' rules are sparsecomm.core's; a compressor class
declares its core method and its `pack` hook (DGC also `dense_payload`).
"""

import tensorflow as tf

from ..core import arguments, methods
from ..core.compressor import Settings
from ..core.exchange import Packed
from ..core.selection import selected_count, stream_of
from . import elastic, exchange, loss_scaling, ops, stages
from . import state as state_module
from .exchange import CARRIED, Wire
from .state import VariableBinding, VariableState


class _OverHorovod:
    """What the core's Settings asks of the ranks, over horovod.tensorflow's process set."""

    def collective_set(self):
        """The process set the exchanges and checks run over (default all ranks)."""
        return self._process_set or exchange.horovod().global_process_set

    def _ranks(self):
        return self.collective_set().size() if exchange.horovod().is_initialized() else 1

    def _rank(self):
        return self.collective_set().rank() if exchange.horovod().is_initialized() else 0

    def _allgather_ints(self, ints, name):
        return exchange.allgather_ints(ints, name, self.collective_set())

    def _measure_network(self, device=None):
        """exchange.measure_network, eagerly; no local cost (the pack runs in the graph) or windows."""
        with tf.init_scope():
            return exchange.measure_network(self.collective_set())


class Compressor(_OverHorovod, Settings, tf.Module):
    """The compress/decompress template every compressor shares: attribution -> route ->
    pack -> exchange -> state updates (residual, momentum, step) -> counters. Hooks:
    ``pack(tensor, state, density) -> Packed`` (with the state after it) and
    ``dense_payload(tensor, state) -> Packed`` (default: the gradient itself), declared by the
    core's Settings.

    Each method's arguments (``variables`` where torch's take ``named_parameters``) and their
    docs are sparsecomm.core.arguments', as its class's docstring shows."""

    framework = "tensorflow"

    def __init__(self, *args, **kwargs):
        tf.Module.__init__(self)
        given = arguments.Given(type(self).__name__, self.method_type, self.framework, args, kwargs)
        Settings.__init__(self, given.method, process_set=given.process_set, **given.settings)
        self._name = self.method.owner
        self._process_set = given.process_set
        self._scaler = loss_scaling.checked_scaler(self._name, given.loss_scaler)
        self._binding = None
        self._resets_seen = elastic.resets()
        if given.binding is not None:
            self._bind(given.binding)

    def _bind(self, variables):
        """Creates the state variables, before any trace and outside it."""
        self._binding = VariableBinding(self._name, variables)
        # tracked by tf.train.Checkpoint, in the order of the variables
        self.state = state_module.states_for(self._binding, self.planner, self.method, self._scaler is not None)

    @property
    def process_set(self):
        return self._process_set

    def replace_loss_scaler(self, given, built):
        """Follows `built`'s loss scale where loss_scaler= was `given` (keras.DistributedOptimizer's copy)."""
        if self._scaler is given:
            self._scaler = loss_scaling.checked_scaler(self._name, built)

    # -- Horovod's hooks ---------------------------------------------------------------------
    # Not converted by autograph: the graph's branches are written as tf.cond / tf.switch_case,
    # and autograph rewriting this library's code was about 40% of the time to trace a step.

    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor):
        """Horovod's hook: (what to allreduce, context for decompress)."""
        state = self._state_for(tensor)
        if self._resets_seen != elastic.resets():  # a reset by elastic.run, even into as many ranks
            self._resets_seen = elastic.resets()
            self._forget_world()
        ranks = self._check_world()
        tensor = tf.convert_to_tensor(tensor)
        overflow = None
        if self._scaler is not None:  # in program order: TF orders the reads and writes of each variable
            state.follow_loss_scale(loss_scaling.current_scale(self._name, self._scaler))
            state.back_up()
            overflow = tf.logical_not(tf.reduce_all(tf.math.is_finite(tensor)))  # before DGC's clipping
        route = self.route(state, tensor, self.method.ratio)
        if route not in ("dense", "shared"):
            handed, finish = stages.per_rank(self, tensor, state, overflow)
        else:
            handed, finish = self._start(route, tensor, state, overflow)
        return elastic.checked_ranks(self._name, ranks, self.collective_set(), handed, finish)

    def _start(self, route, tensor, state, overflow):
        """Dense and shared-coordinate routes: the payload rides Horovod's own allreduce."""
        payload = self.dense_payload(tensor, state) if route == "dense" else self.pack(tensor, state, self.method.ratio)
        if route == "shared" and overflow is not None:
            payload = loss_scaling.nan_first(payload, overflow)
        counts = route == "shared" or self.method.counts_dense_steps
        carrier = CARRIED[route]
        started = carrier.start(payload, self.wire(state, tensor))
        with tf.control_dependencies(state.updates(payload.residual, payload.momentum, counts)):
            handed = tf.identity(started.tensor)
        handed = state.counted(handed, started.count, started.sent, started.received)
        return handed, lambda output: carrier.finish(output, started.context)

    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor, ctx):
        """Horovod's hook: the dense gradient from what the allreduce returned."""
        return ctx(tensor)

    # -- routes, state, settings ---------------------------------------------------------------

    def goes_dense(self, name: str, variable) -> bool:
        """Whether the route of this variable's gradient is dense (starts nothing)."""
        shape, size = tf.TensorShape(variable.shape), tf.as_dtype(variable.dtype).size
        ranks = self._prepare_routing(self._ranks(), measure=False)
        return (
            self.planner.route(name, shape.num_elements(), shape.rank, size, self.method.ratio, ranks, False) == "dense"
        )

    def route(self, state, tensor, density, record=True):
        """The route of a variable's gradient at `density` (measuring the network first if auto needs it)."""
        ranks = self._prepare_routing(self._ranks(), measure=True)
        return self.planner.route(
            state.variable_name, state.numel, state.shape.rank, tensor.dtype.size, density, ranks, record
        )

    def wire(self, state, tensor, k=0):
        return Wire(state.variable_name, state.shape, tensor.dtype, self.collective_set(), self._ranks(), k)

    def _state_for(self, tensor) -> VariableState:
        state_module.checked_gradient(self._name, tensor, self._binding)
        return self.state[self._binding.attribute(tensor)]

    # -- elastic Horovod (sparsecomm.tensorflow.elastic) -----------------------------------------

    def elastic_snapshot(self):
        """A copy of every state variable's value (the elastic state's commit)."""
        return [v.numpy() for v in self.variables]

    def elastic_restore(self, snapshot):
        """Back to a snapshot (the elastic state's restore after a failure)."""
        for variable, value in zip(self.variables, snapshot):
            variable.assign(value)

    def elastic_sync(self):
        """After a reset (no collective here): the next trace of compress checks the settings and
        adopts rank 0's steps, measuring again, with every rank of the new world."""
        self._forget_world()

    def _shared_state(self):
        return state_module.shared_steps(getattr(self, "state", ()))

    def _adopt_shared_state(self, shared):
        state_module.adopt_steps(getattr(self, "state", ()), shared)

    def stats(self) -> dict:
        """Since construction: calls and bytes, and per variable under "tensors" (docs/compressors.md)."""
        return state_module.stats(getattr(self, "state", ()), self.planner.choices)


class RandomBlock(Compressor):
    """Random-block sparsification with a shared seed (Eghlidi & Jaggi 2020), with error
    feedback: sparsecomm.torch.RandomBlock for TensorFlow (same arguments; ``variables``
    instead of ``named_parameters``: the model's trainable variables, or (name, variable)
    pairs)."""

    method_type = methods.RandomBlock

    def pack(self, tensor, state, density):
        start = ops.random_block_start(self.method.seed, state.tensor_id, state.step, state.numel)
        values, residual = ops.block_pack(tensor, state.read_residual(), start, selected_count(density, state.numel))
        return Packed(values, start=start, residual=residual if self.method.error_feedback else None)


class RandomK(RandomBlock):
    """Random-k with a shared seed, with error feedback: sparsecomm.torch.RandomK for TensorFlow."""

    method_type = methods.RandomK

    def pack(self, tensor, state, density):
        values, index, residual, _ = ops.pack_randomk(
            tensor,
            state.read_residual(),
            selected_count(density, state.numel),
            seed=self.method.seed,
            **stream_of(state),
        )
        return Packed(values, index, residual=residual)


class TopK(Compressor):
    """Exact top-k with error feedback: sparsecomm.torch.TopK for TensorFlow (values and int32
    indices by the exchange: allgather, SparDL, or exchange="auto")."""

    method_type = methods.TopK

    def pack(self, tensor, state, density):
        values, index, residual, _ = ops.pack_topk(
            tensor, state.read_residual(), selected_count(density, state.numel), seed=0, **stream_of(state)
        )
        return Packed(values, index, residual=residual)


class RTopK(Compressor):
    """rTop-k (Barnes et al. 2020) with error feedback: sparsecomm.torch.RTopK for TensorFlow."""

    method_type = methods.RTopK

    def pack(self, tensor, state, density):
        numel, method = state.numel, self.method
        values, index, residual, _ = ops.pack_rtopk(
            tensor,
            state.read_residual(),
            selected_count(method.r, numel),
            selected_count(density, numel),
            seed=method.seed_of(self._rank()),
            **stream_of(state),
        )
        return Packed(values, index, residual=residual)


def _sampled(compressor, tensor, state, density, **feedback):
    """The sampled-threshold pack of Threshold and DGC (values quantized as the method says);
    `feedback`: DGC's momentum arguments of pack_sampled."""
    method = compressor.method
    value_dtype, bits = method.value_dtype, method.bits
    values, index, residual, momentum = ops.pack_sampled(
        tensor,
        state.read_residual(),
        density,
        sample_ratio=method.sample_ratio,
        value_dtype=value_dtype and tf.as_dtype(value_dtype),
        bits=bits,
        **stream_of(state),
        **feedback,
    )
    if bits is not None:
        return Packed(index=index, codes=values[0], scales=values[1], bits=bits, residual=residual, momentum=momentum)
    return Packed(values, index, residual=residual, momentum=momentum)


class Threshold(Compressor):
    """Gradient dropping (Aji & Heafield 2017) with error feedback, optionally quantized:
    sparsecomm.torch.Threshold for TensorFlow (same arguments and defaults)."""

    method_type = methods.Threshold

    def pack(self, tensor, state, density):
        return _sampled(self, tensor, state, density)


class DGC(Compressor):
    """Deep Gradient Compression (Lin et al. 2017): sparsecomm.torch.DGC for TensorFlow, with
    the same arguments, defaults and schedule (momentum correction, local gradient clipping,
    momentum factor masking, warm-up). A variable sent dense gets DGC's momentum too
    (u = momentum * u + g, sent dense): pair DGC with a plain SGD optimizer."""

    method_type = methods.DGC

    def _clip_factor(self, tensor, state):
        """Local gradient clipping: the factor limit / norm (1 below the limit), a float32 scalar
        the kernels read the gradient times, in the state's own pass (the torch DGC's rule), or None
        without clipping."""
        limit = self.method.clip_limit(self._ranks())
        if limit is None:
            return None
        if self._scaler is not None:  # the gradient is times the loss scale, and so is the threshold
            limit = limit * tf.cast(state.loss_scale.read_value(), tf.float64)
        norm = tf.sqrt(ops.sum_of_squares(tensor))  # one read, float64; tf.norm would write x * x first
        factor = tf.where(norm > limit, limit / tf.maximum(norm, 1e-300), tf.constant(1.0, tf.float64))
        return tf.cast(factor, tf.float32)

    def dense_payload(self, tensor, state):
        """Momentum SGD for a variable sent dense: u = m u + g, and u is what is reduced (with
        Nesterov, u = m (u + g), and u + g)."""
        payload, momentum = ops.momentum_step(
            tensor, state.momentum.read_value(), **self.method.momentum_args(self._clip_factor(tensor, state))
        )
        return Packed(payload, momentum=momentum)

    def pack(self, tensor, state, density):
        momentum, masking = state.momentum.read_value(), self.method.momentum_masking
        feedback = self.method.momentum_args(self._clip_factor(tensor, state))
        return _sampled(self, tensor, state, density, momentum=momentum, masking=masking, **feedback)
