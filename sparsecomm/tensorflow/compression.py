"""Horovod compressors for TensorFlow: the same family, arguments and defaults as
``sparsecomm.torch``, for ``hvd.DistributedGradientTape``, ``hvd.allreduce``,
``horovod.tensorflow.keras.DistributedOptimizer`` (tf-keras) and
``sparsecomm.tensorflow.keras.DistributedOptimizer`` (Keras 3).

Horovod calls ``compress(grad) -> (tensor, ctx)``, allreduces the tensor and returns
``decompress(output, ctx)``, usually inside a tf.function trace: everything here is TF
ops, and the per-variable state lives in TF variables (sparsecomm/tensorflow/state.py).
Compressors are tf.Modules: ``tf.train.Checkpoint(compression=compressor)`` saves
residuals, momenta and steps.
"""
import fnmatch
import itertools
import math
from typing import Iterable, Optional

import tensorflow as tf

from .. import _cost, _settings
from . import exchange, ops
from .state import VariableBinding, VariableState

_FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
_instances = itertools.count()  # names each compressor's settings check, in construction order


def _payload(values, index):
    """(elements, bytes) a rank hands the allgathers: values plus int32 indices."""
    count = tf.cast(tf.size(index), tf.int64)
    return count, count * (values.dtype.size + 4)


class _BoundCompressor(tf.Module):
    """Shared plumbing: variable binding, per-variable state, the per-layer policy (as
    sparsecomm.torch: a variable goes dense when it has fewer than ``min_numel`` elements,
    when it is 1-D and ``dense_1d``, or when its name matches a pattern in ``dense``),
    argument checks, the cross-rank settings check and stats."""

    def __init__(self, variables, process_set=None, min_numel: int = 1024, dense_1d: bool = True,
                 dense: Iterable[str] = ()):
        super().__init__()
        self._name = type(self).__name__
        if isinstance(min_numel, bool) or not isinstance(min_numel, int) or min_numel < 0:
            raise ValueError(f"{self._name}: min_numel should be an integer >= 0, got {min_numel!r}")
        _settings.check_flag(self._name, "dense_1d", dense_1d)
        if isinstance(dense, str) or not all(isinstance(pattern, str) for pattern in dense):
            raise TypeError(f"{self._name}: dense should be a list of name patterns, got {dense!r}")
        self.min_numel, self.dense_1d, self.dense = min_numel, dense_1d, tuple(dense)
        self._process_set = process_set
        self._pending = lambda: variables  # bound by _bind(), once the subclass's settings are set
        self._binding = None
        self._instance = next(_instances)
        self._settings_checked = False

    def _bind(self):
        """Creates the state variables (subclasses call this once their settings are set)."""
        variables = self._pending()
        if variables is None:
            return
        self._binding = VariableBinding(self._name, variables)
        states = []
        with tf.init_scope():  # state must exist before any trace, and outside it
            for name, shape, dtype in zip(self._binding.names, self._binding.shapes, self._binding.dtypes):
                sparse = not self._policy_dense(name, shape)
                states.append(VariableState(name, shape, dtype, residual=sparse and self._keeps_residual(),
                                            momentum=self._keeps_momentum()))
        self.state = states  # tracked by tf.train.Checkpoint, in the order of the variables

    def _keeps_residual(self):
        return self.error_feedback

    def _keeps_momentum(self):
        return False

    # -- settings ---------------------------------------------------------------------------

    @property
    def process_set(self):
        return self._process_set

    def settings(self) -> str:
        """The settings every rank must share, as text (compared across ranks on the first compress)."""
        public = {k: v for k, v in sorted(vars(self).items())
                  if not k.startswith("_") and isinstance(v, (bool, int, float, str, tuple, type(None), _cost.Network))}
        return f"{self._name}({', '.join(f'{k}={v!r}' for k, v in public.items())})"

    def _check_settings_across_ranks(self):
        """One eager allgather of every rank's settings, on the first compress (escaping any
        trace): different settings raise the same error on every rank instead of hanging."""
        self._settings_checked = True
        hvd = exchange._hvd()
        with tf.init_scope():
            process_set = self._process_set or hvd.global_process_set
            if not hvd.is_initialized() or process_set.size() == 1:
                return
            mine = tf.constant(list(self.settings().encode("utf-8")), dtype=tf.uint8)
            name = f"sparsecomm.settings.{self._instance}"
            lengths = hvd.allgather(tf.reshape(tf.size(mine, out_type=tf.int64), [1]), name=f"{name}.length",
                                    process_set=process_set).numpy().tolist()
            texts = tf.split(hvd.allgather(mine, name=f"{name}.text", process_set=process_set), lengths)
            settings = [bytes(t.numpy().tolist()).decode("utf-8") for t in texts]
        if len(set(settings)) > 1:
            listed = "; ".join(f"rank {r}: {text}" for r, text in enumerate(settings))
            raise ValueError(f"{self._name}: compressor settings differ across ranks ({listed}). "
                             f"Every rank must construct the compressor with the same arguments.")

    # -- policy -----------------------------------------------------------------------------

    def _policy_dense(self, name, shape):
        return (shape.num_elements() < self.min_numel or (self.dense_1d and shape.rank == 1)
                or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.dense)
                or self._sparse_is_larger(shape.num_elements(), None))

    def _sparse_is_larger(self, numel, dtype, density=None, name=None):
        """Shared-coordinate methods never send more than dense; the gathering ones override this."""
        return False

    def goes_dense(self, name: str, variable) -> bool:
        """Whether the per-layer policy sends this variable's gradient dense."""
        shape = tf.TensorShape(variable.shape)
        return self._policy_dense(name, shape) or self._sparse_is_larger(shape.num_elements(),
                                                                         tf.as_dtype(variable.dtype))

    # -- Horovod's hooks --------------------------------------------------------------------

    def compress(self, tensor):
        """Horovod's hook: (what to allreduce, context for decompress)."""
        state = self._state_for(tensor)
        if not self._settings_checked:
            self._check_settings_across_ranks()
        tensor = tf.convert_to_tensor(tensor)
        dense = self._policy_dense(state.variable_name, state.shape)
        if dense or self._sparse_is_larger(state.numel, state.dtype, name=state.variable_name):
            dense = exchange.to_wire(self._dense(tensor, state))  # bfloat16 is summed as float32
            ranks = self._ranks()
            size = state.numel * dense.dtype.size
            dense = self._counted(state, dense, state.numel, size, int(2 * (ranks - 1) / ranks * size))
            return dense, (None if dense.dtype == tensor.dtype else tensor.dtype)
        return self._compress(tensor, state)

    def decompress(self, tensor, ctx):
        """Horovod's hook: the dense gradient from what the allreduce returned."""
        if ctx is None:
            return tensor
        return tf.cast(tensor, ctx) if isinstance(ctx, tf.DType) else ctx(tensor)

    def _dense(self, tensor, state):
        return tensor

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

    def _counted(self, state, tensor, sent_elements, sent_bytes, received_bytes=0, *more):
        """Updates the stats counters; returns `tensor` (and `more`) once they ran."""
        updates = [state.calls.assign_add(1), state.sent_elements.assign_add(tf.cast(sent_elements, tf.int64)),
                   state.sent_bytes.assign_add(tf.cast(sent_bytes, tf.int64)),
                   state.received_bytes.assign_add(tf.cast(received_bytes, tf.int64))]
        with tf.control_dependencies(updates):
            if more:
                return (tf.identity(tensor),) + tuple(tf.identity(t) for t in more)
            return tf.identity(tensor)

    def _assign(self, state, residual=None, momentum=None):
        """The state updates of one compress (residual, momentum, step + 1)."""
        updates = [state.step.assign_add(1)]
        if residual is not None:
            updates.append(state.residual.assign(residual))
        if momentum is not None:
            updates.append(state.momentum.assign(momentum))
        return updates

    def _residual(self, state):
        return state.residual.read_value() if state.residual is not None else None

    def _ranks(self):
        hvd = exchange._hvd()
        return (self._process_set or hvd.global_process_set).size() if hvd.is_initialized() else 1

    # -- state and stats --------------------------------------------------------------------

    def stats(self) -> dict:
        """Since construction (read from the counters): calls, dense_bytes, sent_bytes, and per
        variable under "tensors": the same plus numel, sent_elements and density (sent elements
        per call / numel; 1 when dense). Counts are what this rank hands the collectives."""
        tensors = {}
        for state in getattr(self, "state", ()):
            calls = int(state.calls.numpy())
            sent = int(state.sent_elements.numpy())
            tensors[state.variable_name] = {
                "calls": calls, "numel": state.numel, "sent_elements": sent,
                "dense_bytes": calls * state.numel * state.dtype.size, "sent_bytes": int(state.sent_bytes.numpy()),
                "received_bytes": int(state.received_bytes.numpy()),
                "density": sent / (calls * state.numel) if calls and state.numel else 1.0,
                **{k: v for k, v in getattr(self, "_choices", {}).get(state.variable_name, {}).items() if k != "key"}}
        totals = {key: sum(t[key] for t in tensors.values())
                  for key in ("calls", "dense_bytes", "sent_bytes", "received_bytes")}
        return dict(totals, tensors=tensors)


class _Gathering(_BoundCompressor):
    """Per-rank coordinates, exchanged inside compress: ``exchange="allgather"`` (values and
    int32 indices of every rank), ``"spardl"`` (sparse reduce-scatter + all-gather) or
    ``"auto"`` (default: per tensor, the cheapest of dense, allgather and SparDL by the cost
    model of sparsecomm._cost, on ``network`` or the one measured on the first compress), as
    in sparsecomm.torch. With ``dense_fallback`` (default), a variable whose sparse payload
    (k values + k indices) would not be smaller than dense goes dense."""

    def __init__(self, variables, process_set, dense_fallback, exchange_="auto", network=None, **policy):
        super().__init__(variables, process_set, **policy)
        self.dense_fallback = _settings.check_flag(self._name, "dense_fallback", dense_fallback)
        self.exchange, self.network = _settings.check_exchange(self._name, exchange_, network)
        self._choices = {}

    def _value_bytes(self, dtype):
        return tf.as_dtype(dtype).size

    def _allowed(self):
        return _cost.EXCHANGES

    def _sparse_is_larger(self, numel, dtype, density=None, name=None):
        if dtype is None:
            return False
        size = tf.as_dtype(dtype).size
        k = _settings.selected_count(self.ratio if density is None else density, numel)
        if self.dense_fallback and k * (size + 4) >= numel * size:
            if name is not None:
                self._choices[name] = {"exchange": "dense"}
            return True
        return self._exchange_for(numel, dtype, k, name) == "dense"

    def _exchange_for(self, numel, dtype, k, name=None):
        """The exchange at k: the fixed one, or the cost model's choice (at trace time; the
        network is measured eagerly on first need, the same on every rank)."""
        if self.exchange != "auto":
            if name is not None:
                self._choices[name] = {"exchange": self.exchange}
            return self.exchange
        ranks = self._ranks()
        if ranks == 1:
            return "allgather"
        if self.network is None:
            with tf.init_scope():
                self.network = exchange.measure_network(self._process_set or exchange._hvd().global_process_set)
        size = tf.as_dtype(dtype).size
        choice, predicted = _cost.choose(numel, k, size, self._value_bytes(dtype), ranks, self.network,
                                         self._allowed())
        if name is not None:
            self._choices[name] = {"exchange": choice, "predicted_seconds": predicted}
        return choice

    def _gathered(self, tensor, state, values, index, residual=None, momentum=None, bits=None):
        """Runs the exchange of one packed tensor; returns (placeholder, decompress)."""
        ranks = self._ranks()
        summed, residual, count, sent, received = self._exchange(tensor, state, values, index, residual, bits)
        with tf.control_dependencies(self._assign(state, residual, momentum)):
            placeholder = exchange.placeholder(state.variable_name)
        placeholder = self._counted(state, placeholder, count, sent, received)
        shape, dtype = tensor.shape, tensor.dtype
        return placeholder, lambda output: exchange.finish(output, summed, shape, dtype, ranks)

    def _exchange(self, tensor, state, values, index, residual, bits=None, density=None):
        """(float32 sum over ranks, residual after the exchange, elements sent, bytes sent, bytes received)."""
        process_set = self._process_set or exchange._hvd().global_process_set
        if bits is not None:
            codes, scales = values
            count = tf.cast(tf.size(index), tf.int64)
            sent = tf.cast(tf.size(codes), tf.int64) + 4 * (tf.cast(tf.size(scales), tf.int64) + count) + 8
            summed = exchange.allgather_sum_quantized(codes, scales, index, bits, state.numel, tensor.dtype,
                                                      state.variable_name, process_set)
            return summed, residual, count, sent, (process_set.size() - 1) * sent
        k = _settings.selected_count(self.ratio if density is None else density, state.numel)
        if self._exchange_for(state.numel, tensor.dtype, k, state.variable_name) == "spardl":
            return exchange.spardl_sum(values, index, residual, k, state.numel, state.variable_name, process_set)
        count, sent = _payload(values, index)
        summed, received = exchange.allgather_sum(values, index, state.numel, tensor.dtype, state.variable_name,
                                                  process_set)
        return summed, residual, count, sent, received


class _SharedSeed(_BoundCompressor):
    """Every rank draws the same coordinates from (seed, step, variable name): the packed
    values ride Horovod's allreduce."""

    def __init__(self, ratio: float, seed: int = 0, variables=None, error_feedback: bool = True, process_set=None,
                 **policy):
        super().__init__(variables, process_set, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.seed = _settings.check_seed(self._name, seed)
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)
        self._bind()

    def _shared(self, tensor, state, values, residual, unpack):
        """Hands Horovod the packed values (float32 on the wire for bfloat16)."""
        with tf.control_dependencies(self._assign(state, residual)):
            wire = tf.identity(exchange.to_wire(values))
        count = tf.size(values, out_type=tf.int64)
        wire = self._counted(state, wire, count, count * exchange.wire_bytes(values.dtype))
        shape, dtype = tensor.shape, tensor.dtype
        return wire, lambda output: tf.reshape(unpack(tf.cast(output, dtype)), shape)


class RandomBlock(_SharedSeed):
    """Random-block sparsification with a shared seed (Eghlidi & Jaggi 2020), with error
    feedback: sparsecomm.torch.RandomBlock for TensorFlow (same arguments; ``variables``
    instead of ``named_parameters``: the model's trainable variables, or (name, variable)
    pairs)."""

    def _compress(self, tensor, state):
        k = _settings.selected_count(self.ratio, state.numel)
        start = ops.random_block_start(self.seed, state.tensor_id, state.step, state.numel)
        values, residual = ops.block_pack(tensor, self._residual(state), start, k)
        numel = state.numel
        return self._shared(tensor, state, values, residual if self.error_feedback else None,
                            lambda summed: ops.block_unpack(summed, numel, start))


class RandomK(_SharedSeed):
    """Random-k with a shared seed, with error feedback: sparsecomm.torch.RandomK for TensorFlow."""

    def _compress(self, tensor, state):
        values, index, residual, _ = ops.pack_randomk(tensor, self._residual(state),
                                                      _settings.selected_count(self.ratio, state.numel),
                                                      seed=self.seed, tensor_id=state.tensor_id, step=state.step)
        numel = state.numel
        return self._shared(tensor, state, values, residual, lambda summed: ops.sparse_unpack(summed, index, numel))


class TopK(_Gathering):
    """Exact top-k with error feedback: sparsecomm.torch.TopK for TensorFlow (values and int32
    indices by allgather)."""

    def __init__(self, ratio: float, variables=None, error_feedback: bool = True, process_set=None,
                 dense_fallback: bool = True, exchange: str = "auto", network=None, **policy):
        super().__init__(variables, process_set, dense_fallback, exchange, network, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)
        self._bind()

    def _compress(self, tensor, state):
        values, index, residual, _ = ops.pack_topk(tensor, self._residual(state),
                                                   _settings.selected_count(self.ratio, state.numel), seed=0,
                                                   tensor_id=state.tensor_id, step=state.step)
        return self._gathered(tensor, state, values, index, residual)


class RTopK(_Gathering):
    """rTop-k (Barnes et al. 2020) with error feedback: sparsecomm.torch.RTopK for TensorFlow."""

    def __init__(self, ratio: float, r: float = None, seed: int = 0, variables=None, error_feedback: bool = True,
                 process_set=None, dense_fallback: bool = True, exchange: str = "auto", network=None, **policy):
        super().__init__(variables, process_set, dense_fallback, exchange, network, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.r = _settings.check_r(self._name, self.ratio, r)
        self.seed = _settings.check_seed(self._name, seed)
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)
        self._bind()

    def _compress(self, tensor, state):
        numel = state.numel
        values, index, residual, _ = ops.pack_rtopk(tensor, self._residual(state),
                                                    _settings.selected_count(self.r, numel),
                                                    _settings.selected_count(self.ratio, numel), seed=self.seed,
                                                    tensor_id=state.tensor_id, step=state.step)
        return self._gathered(tensor, state, values, index, residual)


class Threshold(_Gathering):
    """Gradient dropping (Aji & Heafield 2017) with error feedback, optionally quantized:
    sparsecomm.torch.Threshold for TensorFlow (same arguments and defaults)."""

    QUANTIZE = {None: None, "fp16": tf.float16, "bf16": tf.bfloat16, "1bit": 1, "2bit": 2}

    def __init__(self, ratio: float = 0.01, quantize=None, sample_ratio: float = 0.01, variables=None,
                 error_feedback: bool = True, process_set=None, dense_fallback: bool = True, exchange: str = "auto",
                 network=None, **policy):
        super().__init__(variables, process_set, dense_fallback, exchange, network, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.sample_ratio = _settings.check_ratio(self._name, sample_ratio, "sample_ratio")
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)
        self.quantize = _settings.check_quantize(self._name, quantize, self.exchange)
        self._bind()

    def _allowed(self):
        return ("dense", "allgather") if self.quantize in ("1bit", "2bit") else _cost.EXCHANGES

    def _value_bytes(self, dtype):
        kind = self.QUANTIZE[self.quantize]
        if isinstance(kind, int):
            return kind / 8
        return tf.as_dtype(dtype).size if kind is None else 2

    def _compress(self, tensor, state):
        kind = self.QUANTIZE[self.quantize]
        bits = kind if isinstance(kind, int) else None
        values, index, residual, _ = ops.pack_sampled(
            tensor, self._residual(state), self.ratio, sample_ratio=self.sample_ratio, tensor_id=state.tensor_id,
            step=state.step, value_dtype=None if bits else kind, bits=bits)
        return self._gathered(tensor, state, values, index, residual, bits=bits)


class DGC(_Gathering):
    """Deep Gradient Compression (Lin et al. 2017): sparsecomm.torch.DGC for TensorFlow, with
    the same arguments, defaults and schedule (momentum correction, local gradient clipping,
    momentum factor masking, warm-up). A variable the policy sends dense gets DGC's momentum
    too (u = momentum * u + g, sent dense): pair DGC with a plain SGD optimizer."""

    def __init__(self, ratio: float = 0.001, momentum: float = 0.9, momentum_masking: bool = True,
                 clip_norm: Optional[float] = None, warmup_steps: int = 0, warmup_stages: int = 4,
                 sample_ratio: float = 0.01, variables=None, process_set=None, dense_fallback: bool = True,
                 exchange: str = "auto", network=None, **policy):
        super().__init__(variables, process_set, dense_fallback, exchange, network, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.sample_ratio = _settings.check_ratio(self._name, sample_ratio, "sample_ratio")
        self.error_feedback = True
        self.momentum = _settings.check_dgc(self._name, momentum, momentum_masking, clip_norm, warmup_steps,
                                            warmup_stages)
        self.momentum_masking = momentum_masking
        self.clip_norm = clip_norm
        self.warmup_steps = warmup_steps
        self.warmup_stages = warmup_stages
        self._bind()

    def _keeps_momentum(self):
        return True

    def density(self, step: int) -> float:
        """The density at a variable's step: the warm-up schedule, then ratio."""
        if step >= self.warmup_steps:
            return self.ratio
        stage = step * self.warmup_stages // self.warmup_steps
        return self.ratio ** ((stage + 1) / (self.warmup_stages + 1))

    def _densities(self):
        """The density of each warm-up stage, then the final one."""
        stages = self.warmup_stages if self.warmup_steps else 0
        return [self.ratio ** ((s + 1) / (stages + 1)) for s in range(stages)] + [self.ratio]

    def _clipped(self, tensor):
        if self.clip_norm is None:
            return tensor
        limit = self.clip_norm / math.sqrt(self._ranks())
        norm = tf.cast(tf.norm(tf.cast(tensor, tf.float32)), tf.float64)
        scale = tf.cast(limit / tf.maximum(norm, 1e-300), tf.float32)
        return tf.cond(norm > limit, lambda: tf.cast(tf.cast(tensor, tf.float32) * scale, tensor.dtype),
                       lambda: tensor)

    def _momentum_step(self, tensor, state):
        """u = momentum * u + g (the kernel's arithmetic); returns the new u."""
        _, _, _, momentum = ops.accumulate_candidates(tensor, None, float("inf"),
                                                      momentum=state.momentum.read_value(),
                                                      momentum_factor=self.momentum)
        return momentum

    def _dense(self, tensor, state):
        """Momentum SGD for a variable sent dense: u = m u + g, and u is what is reduced."""
        momentum = self._momentum_step(self._clipped(tensor), state)
        with tf.control_dependencies(self._assign(state, momentum=momentum)):
            return tf.reshape(tf.cast(momentum, tensor.dtype), tensor.shape)

    def _compress(self, tensor, state):
        densities = self._densities()
        grad = self._clipped(tensor)

        def stage(density):
            def run():
                if self._sparse_is_larger(state.numel, tensor.dtype, density):  # a dense warm-up stage
                    momentum = self._momentum_step(grad, state)
                    summed = exchange.allreduce_sum(tf.cast(momentum, tensor.dtype), state.variable_name,
                                                    self._process_set or exchange._hvd().global_process_set)
                    count = tf.constant(state.numel, tf.int64)
                    size = count * exchange.wire_bytes(tensor.dtype)
                    ranks = self._ranks()
                    return (summed, state.residual.read_value(), momentum, count, size,
                            tf.cast(2 * (ranks - 1) * size // ranks, tf.int64))
                values, index, residual, momentum = ops.pack_sampled(
                    grad, state.residual.read_value(), density, momentum=state.momentum.read_value(),
                    momentum_factor=self.momentum, masking=self.momentum_masking, sample_ratio=self.sample_ratio,
                    tensor_id=state.tensor_id, step=state.step)
                summed, residual, count, sent, received = self._exchange(tensor, state, values, index, residual,
                                                                         density=density)
                return summed, residual, momentum, count, sent, received
            return run

        if len(densities) == 1:
            summed, residual, momentum, count, sent, received = stage(densities[0])()
        else:
            index = tf.minimum(state.step * self.warmup_stages // self.warmup_steps, self.warmup_stages)
            summed, residual, momentum, count, sent, received = tf.switch_case(tf.cast(index, tf.int32),
                                                                               [stage(d) for d in densities])
        with tf.control_dependencies(self._assign(state, residual, momentum)):
            placeholder = exchange.placeholder(state.variable_name)
        placeholder = self._counted(state, placeholder, count, sent, received)
        ranks, shape, dtype = self._ranks(), tensor.shape, tensor.dtype
        return placeholder, lambda output: exchange.finish(output, summed, shape, dtype, ranks)
