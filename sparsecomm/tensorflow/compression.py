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
import dataclasses
import os
from typing import Optional

import tensorflow as tf

from ..core import loss_scale, methods, report
from ..core.compressor import Settings
from ..core.selection import selected_count
from . import elastic, exchange, ops
from .exchange import EXCHANGES, Packed, Wire
from .state import VariableBinding, VariableState

_FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


class Compressor(Settings, tf.Module):
    """The compress/decompress template every compressor shares: attribution -> route ->
    pack -> exchange -> state updates (residual, momentum, step) -> counters. Hooks:
    ``pack(tensor, state, density) -> Packed`` (with the state after it) and
    ``dense_payload(tensor, state) -> Packed`` (default: the gradient itself).

    Every compressor takes the per-layer policy ``min_numel``, ``dense_1d``, ``dense``,
    ``variables`` (the model's trainable variables, or (name, variable) pairs),
    ``process_set`` and ``loss_scaler`` (mixed precision: the Keras 3
    ``LossScaleOptimizer`` whose scale multiplies the loss; sparsecomm.core.loss_scale)."""

    def __init__(self, method, variables=None, process_set=None, loss_scaler=None, **settings):
        tf.Module.__init__(self)
        self._configure(method, **settings)
        self._name = method.owner
        self._process_set = process_set
        self._scaler = _checked_scaler(self._name, loss_scaler)
        self._binding = None
        self._resets_seen = elastic.resets()
        if variables is not None:
            self._bind(variables)

    def _bind(self, variables):
        """Creates the state variables, before any trace and outside it (a variable too large
        to be sent sparse is refused here, before its residual is allocated)."""
        self._binding = VariableBinding(self._name, variables)
        states = []
        with tf.init_scope():
            for name, shape, dtype in zip(self._binding.names, self._binding.shapes, self._binding.dtypes):
                self.planner.check_indexable(name, shape.num_elements(), shape.rank, dtype.size)
                sparse = not self.planner.always_dense(name, shape.num_elements(), shape.rank, dtype.size)
                states.append(VariableState(name, shape, dtype, residual=sparse and self.method.keeps_residual,
                                            momentum=self.method.keeps_momentum, scaled=self._scaler is not None))
        self.state = states  # tracked by tf.train.Checkpoint, in the order of the variables

    @property
    def process_set(self):
        return self._process_set

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
        self._check_world()
        tensor = tf.convert_to_tensor(tensor)
        overflow = None
        if self._scaler is not None:  # in program order: TF orders the reads and writes of each variable
            state.follow_loss_scale(self._loss_scale())
            state.back_up()
            overflow = tf.logical_not(tf.reduce_all(tf.math.is_finite(tensor)))  # before DGC's clipping
        route = self._route(state, tensor, self.method.ratio)
        if route not in ("dense", "shared"):
            return self._traced_for_these_ranks(*self._per_rank(tensor, state, overflow))
        payload = self.dense_payload(tensor, state) if route == "dense" else self.pack(tensor, state, self.method.ratio)
        if route == "shared" and overflow is not None:
            payload = _nan_first(payload, overflow)
        counts = route == "shared" or self.method.counts_dense_steps
        handed = EXCHANGES[route].start(payload, self._wire(state, tensor))
        with tf.control_dependencies(state.updates(payload.residual, payload.momentum, counts)):
            wire = tf.identity(handed.tensor)
        return self._traced_for_these_ranks(state.counted(wire, handed.count, handed.sent, handed.received),
                                            handed.finish)

    def _traced_for_these_ranks(self, tensor, finish):
        """Under elastic Horovod, a step traced for another number of ranks raises instead of
        exchanging wrongly (routes, layouts and scales are fixed when compress is traced)."""
        if not int(os.environ.get("HOROVOD_ELASTIC", 0)):
            return tensor, finish
        hvd, ranks = exchange._hvd(), self._ranks()
        now = hvd.size_op(process_set_id=self._collective_set().process_set_id)
        check = tf.debugging.assert_equal(
            now, ranks, message=f"{self._name}: this step was traced for {ranks} ranks and the job now has a "
                                f"different number (elastic Horovod): create the tf.function inside the function "
                                f"decorated by hvd.elastic.run, so that each reset traces it again")
        with tf.control_dependencies([check]):
            return tf.identity(tensor), finish

    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor, ctx):
        """Horovod's hook: the dense gradient from what the allreduce returned."""
        return ctx(tensor)

    def _per_rank(self, tensor, state, overflow=None):
        """The per-rank-coordinate exchanges run here, in the graph, one branch per stage of the
        method's schedule; Horovod gets a placeholder (sparsecomm/tensorflow/exchange.py)."""
        densities = self.method.densities()
        wire = self._wire(state, tensor)
        routes = []  # each stage's, as it is traced
        stages = [self._stage(tensor, state, density, routes, overflow) for density in densities]
        if len(stages) == 1:
            outcome = stages[0]()
        else:
            stage = self.method.stage(state.step.read_value(), minimum=tf.minimum)
            outcome = tf.switch_case(tf.cast(stage, tf.int32), stages)
        values, index, dense, residual, momentum, count, sent, received = outcome
        with tf.control_dependencies(state.updates(residual, momentum, True)):
            placeholder = exchange.placeholder(state.variable_name)
        placeholder = state.counted(placeholder, count, sent, received)
        if "dense" not in routes:
            dense = None
        elif routes.count("dense") == len(routes):
            values = index = None
        return placeholder, lambda output: exchange.finish(output, values, index, dense, wire)

    def _stage(self, tensor, state, density, routes, overflow=None):
        """One stage of the schedule as a branch: its route at that density (a warm-up stage may
        go dense; appended to `routes`), pack and exchange, returning tensors only, the same
        structure in every branch (a stage's values and index, or its dense sum, 0 elements where
        the other kind ran)."""
        def run():
            route = self._route(state, tensor, density, record=False)
            routes.append(route)
            packed = self.dense_payload(tensor, state) if route == "dense" else self.pack(tensor, state, density)
            if route != "dense" and overflow is not None:
                packed = _nan_first(packed, overflow)
            wire = self._wire(state, tensor, selected_count(density, state.numel))
            outcome = EXCHANGES[route].run(packed, wire)
            residual = outcome.residual if outcome.residual is not None else state.read_residual()
            values = tf.zeros([0], tensor.dtype) if outcome.values is None else outcome.values
            index = tf.zeros([0], tf.int32) if outcome.index is None else outcome.index
            dense = tf.zeros([0], tf.float32) if outcome.dense is None else outcome.dense
            return (values, index, dense, residual, packed.momentum, outcome.count, outcome.sent,
                    outcome.received)
        return run

    # -- loss scaling (mixed precision; sparsecomm.core.loss_scale) --------------------------

    def _loss_scale(self):
        """The scaler's current scale, read in the graph (its variable)."""
        if not self._scaler.built:
            raise RuntimeError(f"{self._name}: the loss_scaler (LossScaleOptimizer) is not built: call "
                               f"optimizer.build(model.trainable_variables) before the first step")
        return tf.convert_to_tensor(self._scaler.dynamic_scale.value)

    # -- the hooks a method declares -----------------------------------------------------------

    def pack(self, tensor, state, density) -> Packed:
        raise NotImplementedError

    def dense_payload(self, tensor, state) -> Packed:
        """What a gradient routed dense sends: itself (DGC: its momentum)."""
        return Packed(tensor)

    # -- routes, state, settings ---------------------------------------------------------------

    def goes_dense(self, name: str, variable) -> bool:
        """Whether the route of this variable's gradient is dense (starts nothing: see
        _routing_ranks)."""
        shape = tf.TensorShape(variable.shape)
        ranks = self._routing_ranks(self._ranks(), measure=False)
        return self.planner.route(name, shape.num_elements(), shape.rank, tf.as_dtype(variable.dtype).size,
                                  self.method.ratio, ranks, record=False) == "dense"

    def _route(self, state, tensor, density, record=True):
        return self.planner.route(state.variable_name, state.numel, state.shape.rank, tensor.dtype.size, density,
                                  self._routing_ranks(self._ranks(), measure=True), record)

    def _measure_network(self):
        """The network, measured eagerly (even inside a trace). The sparse path's local cost is
        not measured in TF (its pack runs inside the graph): the copy-bandwidth estimate."""
        with tf.init_scope():
            return exchange.measure_network(self._collective_set()), None

    def _wire(self, state, tensor, k=0):
        return Wire(state.variable_name, state.shape, tensor.dtype, self._collective_set(), self._ranks(), k)

    def _state_for(self, tensor) -> VariableState:
        if self._binding is None:
            raise RuntimeError(f"{self._name} keeps per-variable state and needs variables=: construct it as "
                               f"{self._name}(..., variables=model.trainable_variables)")
        if isinstance(tensor, tf.IndexedSlices):
            raise TypeError(f"{self._name}: got tf.IndexedSlices; Horovod gathers those without compression "
                            f"(or densify them with sparse_as_dense=True)")
        dtype = getattr(tensor, "dtype", None)
        if dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{self._name}: gradients should be float32, float16 or bfloat16, got "
                            f"{getattr(dtype, 'name', type(tensor).__name__)}")
        return self.state[self._binding.attribute(tensor)]

    def _collective_set(self):
        return self._process_set or exchange._hvd().global_process_set

    def _ranks(self):
        return self._collective_set().size() if exchange._hvd().is_initialized() else 1

    def _allgather_ints(self, ints, name):
        hvd = exchange._hvd()
        with tf.init_scope():  # eagerly, even inside a trace
            return hvd.allgather(tf.constant(ints, tf.int64), name=name, process_set=self._collective_set()
                                 ).numpy().tolist()

    # -- elastic Horovod (sparsecomm.tensorflow.elastic) -----------------------------------------

    def elastic_snapshot(self):
        """A copy of every state variable's value (the elastic state's commit)."""
        return [v.numpy() for v in self.variables]

    def elastic_restore(self, snapshot):
        """Back to a snapshot (the elastic state's restore after a failure)."""
        for variable, value in zip(self.variables, snapshot):
            variable.assign(value)

    def elastic_sync(self):
        """After a reset (no collective here): the next trace of compress checks the settings,
        adopts rank 0's steps and measures the network again, with every rank of the new world."""
        self._forget_world()

    def _shared_state(self):
        with tf.init_scope():  # read eagerly, even inside a trace
            return {state.variable_name: {"step": int(state.step.numpy())} for state in getattr(self, "state", ())}

    def _adopt_shared_state(self, shared):
        with tf.init_scope():
            for state in getattr(self, "state", ()):
                if state.variable_name in shared:
                    state.step.assign(shared[state.variable_name]["step"])

    def stats(self) -> dict:
        """Since construction (read from the counters): calls, dense_bytes, sent_bytes,
        received_bytes, and per variable under "tensors": the same plus numel, sent_elements,
        density (sent elements per call / numel; 1 when dense) and the exchange chosen. Counts
        are what this rank hands the collectives."""
        tensors = {state.variable_name: report.tensor_stats(state.counters(), state.numel,
                                                            self.planner.choices.get(state.variable_name))
                   for state in getattr(self, "state", ())}
        return dict(report.totals(tensors), tensors=tensors)


def _checked_scaler(owner, scaler):
    """loss_scaler=: None or a Keras 3 LossScaleOptimizer (its factors are fixed: 2 and 1/2)."""
    if scaler is None:
        return None
    import keras
    if not isinstance(scaler, keras.optimizers.LossScaleOptimizer):
        raise TypeError(f"{owner}: loss_scaler should be None or the keras.optimizers.LossScaleOptimizer that scales "
                        f"the loss, got {type(scaler).__name__}")
    loss_scale.check_factors(owner, 0.5, 2.0)  # LossScaleOptimizer's own, fixed
    return scaler


def _nan_first(packed, overflow):
    """Under a loss scaler: a payload whose gradient held an inf or NaN (`overflow`, a bool
    tensor) starts with a NaN (quantized: every scale is NaN), so every rank's scaler sees it
    whatever coordinates were picked."""
    nan = float("nan")
    if packed.bits is not None:
        return dataclasses.replace(packed, scales=tf.where(overflow, tf.fill(tf.shape(packed.scales), nan),
                                                           packed.scales))
    values = tf.reshape(packed.values, [-1])
    first = tf.where(overflow, tf.constant(nan, values.dtype), values[:1])
    return dataclasses.replace(packed, values=tf.concat([first, values[1:]], 0))


class RandomBlock(Compressor):
    """Random-block sparsification with a shared seed (Eghlidi & Jaggi 2020), with error
    feedback: sparsecomm.torch.RandomBlock for TensorFlow (same arguments; ``variables``
    instead of ``named_parameters``: the model's trainable variables, or (name, variable)
    pairs)."""
    method_type = methods.RandomBlock

    def __init__(self, ratio: float, seed: int = 0, variables=None, error_feedback: bool = True, process_set=None,
                 loss_scaler=None, **policy):
        super().__init__(self.method_type(type(self).__name__, ratio, seed, error_feedback), variables,
                         process_set, loss_scaler, **policy)

    def pack(self, tensor, state, density):
        start = ops.random_block_start(self.method.seed, state.tensor_id, state.step, state.numel)
        values, residual = ops.block_pack(tensor, state.read_residual(), start, selected_count(density, state.numel))
        return Packed(values, start=start, residual=residual if self.method.error_feedback else None)


class RandomK(RandomBlock):
    """Random-k with a shared seed, with error feedback: sparsecomm.torch.RandomK for TensorFlow."""
    method_type = methods.RandomK

    def pack(self, tensor, state, density):
        values, index, residual, _ = ops.pack_randomk(tensor, state.read_residual(),
                                                      selected_count(density, state.numel),
                                                      seed=self.method.seed, tensor_id=state.tensor_id,
                                                      step=state.step)
        return Packed(values, index, residual=residual)


class TopK(Compressor):
    """Exact top-k with error feedback: sparsecomm.torch.TopK for TensorFlow (values and int32
    indices by the exchange: allgather, SparDL, or exchange="auto")."""

    def __init__(self, ratio: float, variables=None, error_feedback: bool = True, process_set=None,
                 dense_fallback: bool = True, exchange: str = "auto", network=None, loss_scaler=None, **policy):
        super().__init__(methods.TopK(type(self).__name__, ratio, error_feedback), variables, process_set,
                         loss_scaler, dense_fallback=dense_fallback, exchange=exchange, network=network, **policy)

    def pack(self, tensor, state, density):
        values, index, residual, _ = ops.pack_topk(tensor, state.read_residual(), selected_count(density, state.numel),
                                                   seed=0, tensor_id=state.tensor_id, step=state.step)
        return Packed(values, index, residual=residual)


class RTopK(Compressor):
    """rTop-k (Barnes et al. 2020) with error feedback: sparsecomm.torch.RTopK for TensorFlow."""

    def __init__(self, ratio: float, r: float = None, seed: int = 0, variables=None, error_feedback: bool = True,
                 process_set=None, dense_fallback: bool = True, exchange: str = "auto", network=None, loss_scaler=None,
                 **policy):
        super().__init__(methods.RTopK(type(self).__name__, ratio, r, seed, error_feedback), variables, process_set,
                         loss_scaler, dense_fallback=dense_fallback, exchange=exchange, network=network, **policy)

    def pack(self, tensor, state, density):
        numel, method = state.numel, self.method
        values, index, residual, _ = ops.pack_rtopk(tensor, state.read_residual(), selected_count(method.r, numel),
                                                    selected_count(density, numel), seed=method.seed,
                                                    tensor_id=state.tensor_id, step=state.step)
        return Packed(values, index, residual=residual)


def _sampled(compressor, tensor, state, density, momentum=None, momentum_factor=0.0, masking=True, grad_scale=None):
    """The sampled-threshold pack of Threshold and DGC (values quantized as the method says)."""
    method = compressor.method
    value_dtype, bits = method.value_dtype, method.bits
    values, index, residual, momentum = ops.pack_sampled(
        tensor, state.read_residual(), density, momentum=momentum, momentum_factor=momentum_factor,
        masking=masking, sample_ratio=method.sample_ratio, tensor_id=state.tensor_id, step=state.step,
        value_dtype=value_dtype and tf.as_dtype(value_dtype), bits=bits, grad_scale=grad_scale)
    if bits is not None:
        return Packed(index=index, codes=values[0], scales=values[1], bits=bits, residual=residual,
                      momentum=momentum)
    return Packed(values, index, residual=residual, momentum=momentum)


class Threshold(Compressor):
    """Gradient dropping (Aji & Heafield 2017) with error feedback, optionally quantized:
    sparsecomm.torch.Threshold for TensorFlow (same arguments and defaults)."""

    def __init__(self, ratio: float = 0.01, quantize=None, sample_ratio: float = 0.01, variables=None,
                 error_feedback: bool = True, process_set=None, dense_fallback: bool = True, exchange: str = "auto",
                 network=None, loss_scaler=None, **policy):
        super().__init__(methods.Threshold(type(self).__name__, ratio, quantize, sample_ratio, error_feedback,
                                           exchange), variables, process_set, loss_scaler,
                         dense_fallback=dense_fallback, exchange=exchange, network=network, **policy)

    def pack(self, tensor, state, density):
        return _sampled(self, tensor, state, density)


class DGC(Compressor):
    """Deep Gradient Compression (Lin et al. 2017): sparsecomm.torch.DGC for TensorFlow, with
    the same arguments, defaults and schedule (momentum correction, local gradient clipping,
    momentum factor masking, warm-up). A variable sent dense gets DGC's momentum too
    (u = momentum * u + g, sent dense): pair DGC with a plain SGD optimizer."""

    def __init__(self, ratio: float = 0.001, momentum: float = 0.9, momentum_masking: bool = True,
                 clip_norm: Optional[float] = None, warmup_steps: int = 0, warmup_stages: int = 4,
                 sample_ratio: float = 0.01, variables=None, process_set=None, dense_fallback: bool = True,
                 exchange: str = "auto", network=None, loss_scaler=None, **policy):
        super().__init__(methods.DGC(type(self).__name__, ratio, momentum, momentum_masking, clip_norm, warmup_steps,
                                     warmup_stages, sample_ratio), variables, process_set, loss_scaler,
                         dense_fallback=dense_fallback, exchange=exchange, network=network, **policy)

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
        """Momentum SGD for a variable sent dense: u = m u + g, and u is what is reduced."""
        payload, momentum = ops.momentum_step(tensor, state.momentum.read_value(), self.method.momentum,
                                              grad_scale=self._clip_factor(tensor, state))
        return Packed(payload, momentum=momentum)

    def pack(self, tensor, state, density):
        return _sampled(self, tensor, state, density, momentum=state.momentum.read_value(),
                        momentum_factor=self.method.momentum, masking=self.method.momentum_masking,
                        grad_scale=self._clip_factor(tensor, state))
